"""HeurFedAMP (Huang et al., AAAI 2021, the heuristic for deep networks): FedAMP with a fixed self-weight.

Euclidean distances between deep models say little, so the paper's heuristic keeps the client's own
share of its cloud model fixed, xi_ii = ``self-weight``, and splits the rest among the other clients
of the round by a softmax of sigma cos(w_i, w_j) (``fedamp_math.heurfedamp_weights``). Everything else
is FedAMP's (fedstrategies/fedamp.py, clients/fedamp.py): the proximal local objective
F_i(w) + lambda / (2 alpha_k) ||w - u_i||^2 and evaluation of the client's own w_i. FedMCSA's paper
compares against it and notes that the self-weight would ideally be 1 / (M_i + 1), M_i being the
number of clients with the same distribution.
"""

from __future__ import annotations

import numpy as np

from fedstrategies import pairwise
from fedstrategies.fedamp import FedAMPStrategy
from fedstrategies.fedamp_math import heurfedamp_weights


class HeurFedAMPStrategy(FedAMPStrategy):
    """FedAMP's server with the heuristic attention."""

    def attention(self, states: list[dict[str, np.ndarray]]) -> np.ndarray:
        return heurfedamp_weights(pairwise.cosine_matrix(pairwise.gram(states)), self.hp["sigma"],
                                  self.hp["self-weight"])
