"""GPFL's two global modules, which both sides build: the Global Category Embedding layer (GCE) and
the Conditional Valve (CoV) (Zhang et al., ICCV 2023; architecture as the authors' code).

The server builds their seeded initial weights and averages them with the body every round; the
client loads what it receives into these modules to train and evaluate. Their state-dict keys travel
in the ``weights`` record beside the body's, under the ``gce.`` and ``cov.`` prefixes.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedcore import wire
from fedcore.methods.gpfl import COV_PREFIX, GCE_PREFIX, MODULE_PREFIXES  # noqa: F401  (GPFL's declaration)


class CoV(nn.Module):
    """Conditional Valve: feature f and a conditional input c (d,) give ReLU(f * (gamma(c) + 1) + beta(c)),
    with gamma and beta each Linear(d, d) -> ReLU -> LayerNorm(d)."""

    def __init__(self, dim: int):
        super().__init__()
        self.gamma = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.LayerNorm([dim]))
        self.beta = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.LayerNorm([dim]))

    def forward(self, f: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        return torch.relu(f * (self.gamma(context) + 1) + self.beta(context))


class GPFLModules(nn.Module):
    """GCE (a (C, d) class-embedding table) and CoV, as one module whose keys are ``gce.*`` and ``cov.*``."""

    def __init__(self, dim: int, num_classes: int):
        super().__init__()
        self.gce = nn.Embedding(num_classes, dim)
        self.cov = CoV(dim)


def initial_module_weights(dim: int, num_classes: int, seed: int) -> dict[str, np.ndarray]:
    """The seeded initial GCE and CoV (PyTorch's default inits), as numpy arrays by state-dict key."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(np.random.SeedSequence([int(seed), 31]).generate_state(1)[0]))
        modules = GPFLModules(dim, num_classes)
    return {k: wire.to_host(v).copy() for k, v in modules.state_dict().items()}
