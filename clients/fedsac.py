"""FedSaC client (Algorithm 1, lines 4-8): train the received personalised model, then describe the
local feature distribution by a rank-k subspace.

1. Start from theta~_i (the received model) and keep it, detached, as the reference.
2. ``local-steps`` SGD iterations (reshuffled across epochs; the optimiser is new every round) of
   CE - lambda * cos(vec(theta), vec(theta~_i)) (Eq. 9). The server says per message whether the
   regulariser is on: it is off while theta~_i is still theta(0). The authors' code variant
   (``regulariser = "authors"``) adds +lambda <c_i, theta>/|theta| instead, c_i sent by the server.
3. Penultimate features of all local training samples (eval mode, no augmentation) -> their top-k
   right singular vectors U_i (d x k, orthonormal; Eq. 5 read as in spec A1), centred first if
   ``center`` (the authors' PCA).
4. Upload theta_i and U_i; keep theta_i, which is evaluated beside the aggregated theta~_i.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parameters_to_vector

from clients.base import ClientMethod, EvalResult
from clients.training import evaluate_model, extract_features
from fedcore import wire
from fedcore.methods.fedsac import AGGREGATED_ACC, BASIS, COS_TO_RECEIVED, LOCAL_ACC, REFERENCE, REGULARISER, SUBSPACE

MODEL = "model"  # client state: the last locally trained model theta_i


def subspace_basis(features: torch.Tensor, k: int, center: bool = False) -> np.ndarray:
    """Orthonormal basis (d, k) of the top-k subspace of the (n, d) feature matrix (Eq. 5).

    The top-k right singular vectors of the n x d matrix, i.e. the left ones of Eq. 5's d x n
    matrix X^i. Signs follow scikit-learn's ``svd_flip`` (each column's largest-magnitude entry is
    positive), so the authors' greedy column matching sees deterministic signs.
    """
    x = features.detach().to(torch.float64).cpu()
    if center:
        x = x - x.mean(dim=0, keepdim=True)
    _, _, vh = torch.linalg.svd(x, full_matrices=len(x) < k)  # full V only when there are fewer samples than k
    basis = vh[:k].T
    sign = torch.sign(basis[basis.abs().argmax(dim=0), torch.arange(k)])
    sign[sign == 0] = 1.0
    return wire.to_host(basis * sign).astype(np.float32)


def regulariser(mode: str, lam: float, reference: torch.Tensor) -> Callable[[nn.Module], torch.Tensor]:
    """The local pull term added to the cross-entropy, as a function of the model being trained.

    ``paper`` (Eq. 9): -lambda * cos(vec(theta), reference), reference = vec(theta~_i).
    ``authors`` (their code): +lambda * <reference, vec(theta)> / |vec(theta)|, reference = c_i.
    ``reference`` is detached: no gradient flows into it.
    """
    reference = reference.detach()
    if mode == "paper":
        return lambda model: -lam * F.cosine_similarity(parameters_to_vector(model.parameters()), reference, dim=0)
    if mode == "authors":
        def authors(model):
            theta = parameters_to_vector(model.parameters())
            return lam * torch.dot(reference, theta) / theta.norm()
        return authors
    raise ValueError(f"unknown regulariser {mode!r}")


class FedSaCClient(ClientMethod):
    def fit(self, content):
        model = self.model_from(content, wire.WEIGHTS)
        received = parameters_to_vector(model.parameters()).detach().clone()
        mode = self.env.config[REGULARISER]
        reg = None
        if mode == "paper":
            reg = regulariser(mode, self.hp["lambda"], received)
        elif mode == "authors":
            ref = wire.torch_arrays(content.array_records[REFERENCE])
            vector = torch.cat([ref[name].reshape(-1) for name, _ in model.named_parameters()]).to(received)
            reg = regulariser(mode, self.hp["lambda"], vector)

        def loss_fn(m, xb, yb):
            loss = F.cross_entropy(m(xb), yb)
            return loss if reg is None else loss + reg(m)

        loss = self.train(model, loss_fn=loss_fn)  # local-steps iterations; a new SGD optimiser every round
        self.save_model(model, MODEL)
        drift = float(F.cosine_similarity(parameters_to_vector(model.parameters()).detach(), received, dim=0))
        return ({wire.WEIGHTS: wire.pack_arrays(model.state_dict()), **self.describe(model)},
                {wire.TRAIN_LOSS: loss, wire.METHOD_METRIC_PREFIX + COS_TO_RECEIVED: drift})

    def describe(self, model) -> dict:
        """What the trained model says about the local data besides its weights: the feature subspace U_i."""
        basis = subspace_basis(extract_features(model, self.data.x_train), self.hp["k"], self.hp["center"])
        return {SUBSPACE: wire.pack_arrays({BASIS: basis})}

    def evaluate(self, content):
        """Both personalised models: theta_i after the client's last local training (kept in its state;
        theta(0) before it first trains) and the aggregated theta~_i the server sent. ``eval-model``
        picks the headline; both are reported (``local-acc``, ``aggregated-acc``)."""
        scores = {"local": evaluate_model(self.load_model(MODEL), self.data.x_test, self.data.y_test),
                  "aggregated": evaluate_model(self.model_from(content, wire.WEIGHTS), self.data.x_test,
                                               self.data.y_test)}
        acc = {name: correct / max(n, 1) for name, (_, correct, n) in scores.items()}
        metrics = {LOCAL_ACC: acc["local"], AGGREGATED_ACC: acc["aggregated"]}
        return EvalResult(*scores[self.hp["eval-model"]], metrics=metrics)
