"""pFedGraph (Ye et al., ICML 2023, "Personalized Federated Learning with Inferred Collaboration Graphs").

FedSaC grew out of pFedGraph and keeps its graph: this module is FedSaC's strategy
(fedstrategies/fedsac.py) without the complementarity term and with pFedGraph's own weighting.

Each round, for every participating client i, the server infers row i of the collaboration graph from
the data weights p and the cosine similarity S_ij of the model updates theta_j - theta(0):

    min_{a on the simplex}  alpha ||a - p||^2 - sum_j S_ij a_j

(the authors' code: ``cp.quad_form(x, alpha I) + (d - 2 alpha p) @ x`` with d_ij = -S_ij, and S_ij > 0.9
set to 1), which is FedSaC's Eq. 8 with alpha_FedSaC = 0 and beta = 1 / alpha: the Euclidean projection
of p + S_i / (2 alpha) onto the simplex. Client i then gets theta~_i = sum_j W_ij theta_j and trains it
with CE - lambda cos(theta, theta~_i). Defaults are the authors' (alpha 0.8, lambda 0.01, clamp 0.9,
updates from theta(0) over trained parameters only); the local SGD setting is in fedcore/methods/pfedgraph.py.
"""

from __future__ import annotations

import numpy as np

from fedcore import wire
from fedstrategies.base import weights_schema
from fedstrategies.fedsac import FedSaCStrategy
from fedstrategies.fedsac_math import collaboration_graph, graph_diagnostics


class PFedGraphStrategy(FedSaCStrategy):
    """FedSaC's state, messages and aggregation; the graph from similarity and data size alone."""

    def check_model(self, model) -> None:
        """No feature subspace: every model fits."""

    def reply_schema(self, pid):
        return {wire.WEIGHTS: weights_schema(self.initial_weights)}

    def check_reply(self, reply):
        if reply.num_examples <= 0:
            return "num-examples must be positive (it is the client's data weight p_j)"
        return None

    def solve_graph(self, server_round, p, similarity, replies):
        """Row i: argmin alpha ||a - p||^2 - S_i . a on the simplex = Proj(p + S_i / (2 alpha))."""
        graph = collaboration_graph(p, similarity, np.zeros_like(similarity), 0.0, 1.0 / self.hp["alpha"],
                                    self.hp["solver"])
        return graph, graph_diagnostics(graph, p, similarity)
