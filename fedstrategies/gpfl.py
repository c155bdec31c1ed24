"""GPFL (Zhang et al., ICCV 2023): global and personalised feature information through a
Conditional Valve (CoV) guided by a Global Category Embedding layer (GCE).

Client model: a feature extractor, the CoV, the GCE and a head. The extractor, CoV and GCE are
global: the server averages them weighted by training-set size, as FedAvg, and sends them to
every client; the head is personal and never leaves the client (clients/gpfl.py has the loss).
"""

from __future__ import annotations

from fedcore.conditional_valve import initial_module_weights
from fedcore.methods.gpfl import MODULE_PREFIXES
from fedcore.models import BODY_PREFIX
from fedstrategies.fedavg import FedAvgStrategy


class GPFLStrategy(FedAvgStrategy):
    """FedAvg over the body, the GCE and the CoV; the head stays on the clients."""

    def __init__(self, cfg, clients, model):
        super().__init__(cfg, clients, model)
        self.global_weights.update(initial_module_weights(model.feature_dim, model.num_classes, cfg["seed"]))

    def is_shared(self, key: str) -> bool:
        return key.startswith((BODY_PREFIX, *MODULE_PREFIXES))
