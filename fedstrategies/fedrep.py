"""FedRep (Collins et al., ICML 2021): shared representation (body), personal heads.

Server rule as FedPer (average the bodies); the client trains its head first with the body fixed,
then the body with the head fixed (clients/fedrep.py).
"""

from fedstrategies.fedper import FedPerStrategy


class FedRepStrategy(FedPerStrategy):
    """Same server side as FedPer."""
