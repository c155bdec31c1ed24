"""pFedGraph client (Ye et al., ICML 2023): FedSaC's local update (clients/fedsac.py) without the
feature subspace, which pFedGraph's server does not use.

Start from the received theta~_i = sum_j W_ij theta_j, run ``local-steps`` SGD iterations of
CE - lambda cos(theta, theta~_i) (off while theta~_i is still theta(0), as in the authors' ``round > 0``),
upload theta_i; evaluate theta_i and theta~_i.
"""

from __future__ import annotations

from clients.fedsac import FedSaCClient


class PFedGraphClient(FedSaCClient):
    def describe(self, model) -> dict:
        """Nothing but the weights goes up."""
        return {}
