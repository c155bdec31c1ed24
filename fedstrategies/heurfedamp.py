"""HeurFedAMP (Huang et al., AAAI 2021, the heuristic for deep networks): FedAMP with a fixed self-weight.

Euclidean distances between deep models say little, so the paper's heuristic keeps the client's own
share of its cloud model fixed, xi_ii = ``self-weight``, and splits the rest among the other clients
of the round by a softmax of sigma cos (``fedamp_math.heurfedamp_weights``). Everything else
is FedAMP's (fedstrategies/fedamp.py, clients/fedamp.py): the proximal local objective
F_i(w) + lambda / (2 alpha_k) ||w - u_i||^2 and evaluation of the client's own w_i. FedMCSA's paper
compares against it and notes that the self-weight would ideally be 1 / (M_i + 1), M_i being the
number of clients with the same distribution.

The defaults are pFedGraph's FedAMP baseline (the code behind FedSaC's tables, github.com/MediaBrain-SJTU/
pFedGraph): the cosines of the updates from the common initial model, w_i - w_0, sigma = 10 and
xi_ii = 0.3. The paper's cosines of the raw parameters (``similarity = weights``) are 0.90-0.999 for models
from one start, so a softmax of them is nearly uniform (with our earlier sigma = 1: weights 0.0251-0.0274
against a uniform 0.0263, i.e. half own model, half the mean); the updates' cosines spread over most of
[-1, 1] and the attention tells clusters apart (``m_attention-spread`` in rounds.csv).
"""

from __future__ import annotations

import numpy as np

from fedstrategies import pairwise
from fedstrategies.fedamp import FedAMPStrategy
from fedstrategies.fedamp_math import heurfedamp_weights


class HeurFedAMPStrategy(FedAMPStrategy):
    """FedAMP's server with the heuristic attention."""

    def attention(self, states: list[dict[str, np.ndarray]]) -> np.ndarray:
        origin = self.initial_weights if self.hp["similarity"] == "update" else None
        cos = pairwise.cosine_matrix(pairwise.gram(states, minus=origin))
        return heurfedamp_weights(cos, self.hp["sigma"], self.hp["self-weight"])
