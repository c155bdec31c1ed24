"""FedFCD's server-side math: the global head phi_g trained on (LFR, label) pairs (Eq. 4).

The GFR side of the server rule (Eq. 5) is the shared per-class feature mean in
``fedstrategies/prototypes.py``.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F

from fedcore.models import one_torch_thread
from fedcore.wire import CLASS_IDS, FEATURES


def feature_pairs(parts: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """The server head's training set: every (class-mean feature, class) pair of the replies' class-feature records,
    one pair per (client, class), unweighted (FedFCD's Eq. 4, FedGH's header step)."""
    x = torch.from_numpy(np.concatenate([p[FEATURES] for p in parts]).astype(np.float32, copy=False))
    y = torch.from_numpy(np.concatenate([p[CLASS_IDS] for p in parts]).astype(np.int64, copy=False))
    return x, y


class GlobalHead:
    """phi_g = Linear(d, C) with its own SGD optimiser, kept together so that restoring a checkpoint
    (``load_state_dict``) restores both and keeps the optimiser bound to this head's parameters.

    Parameters
    ----------
    weight, bias : np.ndarray
        Initial (C, d) weight and (C,) bias: the seeded initial model's head, so that every client's
        personal head starts equal to the global one (spec section 2).
    lr, momentum : float
        SGD step size eta_phi_g (paper: 0.01) and momentum (0: plain SGD, as proposed).
    """

    def __init__(self, weight: np.ndarray, bias: np.ndarray, lr: float, momentum: float = 0.0):
        num_classes, dim = weight.shape
        self.linear = torch.nn.Linear(dim, num_classes)
        with torch.no_grad():
            self.linear.weight.copy_(torch.as_tensor(np.array(weight, dtype=np.float32)))
            self.linear.bias.copy_(torch.as_tensor(np.array(bias, dtype=np.float32)))
        self.optimizer = torch.optim.SGD(self.linear.parameters(), lr=lr, momentum=momentum)

    def state_dict(self) -> dict:
        """The head's parameters and its optimiser's state, as copies in plain dicts (a checkpoint's
        data: torch's own state dicts are OrderedDicts with metadata, which checkpoints refuse)."""
        return {"linear": {k: v.clone() for k, v in self.linear.state_dict().items()},
                "optimizer": copy.deepcopy(self.optimizer.state_dict())}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a ``state_dict``; the optimiser stays bound to this head's parameters."""
        self.linear.load_state_dict(state["linear"])
        self.optimizer.load_state_dict(state["optimizer"])

    def arrays(self) -> dict[str, np.ndarray]:
        """The head as numpy arrays (copies): ``weight`` (C, d) and ``bias`` (C,)."""
        return {"weight": self.linear.weight.detach().numpy().copy(), "bias": self.linear.bias.detach().numpy().copy()}

    @torch.no_grad()
    def loss(self, features: torch.Tensor, labels: torch.Tensor) -> float:
        """Mean cross-entropy of the head on (feature, label) pairs."""
        if not len(labels):
            return 0.0
        with one_torch_thread():
            return float(F.cross_entropy(self.linear(features), labels))

    def train(self, features: torch.Tensor, labels: torch.Tensor, *, batch_size: int, epochs: int,
              generator: torch.Generator) -> float:
        """Mini-batch SGD on mean cross-entropy, one shuffled pass per epoch (Eq. 4 with the
        proposed amount: PFLlib FedGH's one epoch, batch 10); returns the mean batch loss.

        The pairs are one per (uploading client, class), unweighted, as the paper writes them.
        """
        if not len(labels):  # randperm(0).split gives one empty batch, whose mean CE is NaN
            return 0.0
        losses = []
        with one_torch_thread():
            for _ in range(epochs):
                order = torch.randperm(len(labels), generator=generator)
                for idx in order.split(batch_size):
                    self.optimizer.zero_grad(set_to_none=True)
                    loss = F.cross_entropy(self.linear(features[idx]), labels[idx])
                    loss.backward()
                    self.optimizer.step()
                    losses.append(loss.detach())
        return float(torch.stack(losses).mean())
