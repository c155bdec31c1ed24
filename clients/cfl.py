"""CFL client: train the received cluster model on the local data and send it back (the server forms
the update w_i - theta_c); evaluate the received cluster model. Local training is FedAvg's."""

from clients.fedavg import FedAvgClient


class CFLClient(FedAvgClient):
    """FedAvg's client: in CFL everything that differs happens on the server (fedstrategies/cfl.py)."""
