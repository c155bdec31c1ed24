"""GPFL client: the global extractor, CoV and GCE (received) and a personal head (kept).

With f = extractor(x), the embedding table W (C, d) of the received GCE, held fixed for the round
(the authors' ``GCE_frozen``), and the client's class shares alpha_c = n_c / n:

- conditional inputs: global g = (1/C) sum_c W_c, personalised p_i = sum_c alpha_c W_c (constants);
- personalised route: f_P = CoV(f, p_i), logits = head(f_P), loss CE(logits, y);
- global route: f_G = CoV(f, g), angle-level guidance: CE over the cosines cos(f_G, W'_c) with the GCE
  being trained (W'), magnitude-level guidance: lambda * ||f_G - W_y||_2 (the 2-norm of the whole
  batch's difference, as the authors' code writes it);
- one SGD step of the sum on extractor and head, GCE and CoV (these two with weight decay mu).

Uploads extractor, GCE and CoV; keeps the head. Prediction: argmax head(CoV(f, p_i)).
The conditional inputs come from the received global GCE (the paper's rule); the authors' code
takes them from the client's GCE just before it is replaced, which for a client that trained in
the last round is its own trained copy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from clients.base import ClientMethod, EvalResult
from clients.batch_metrics import mean_loss
from clients.training import evaluate_logits, extract_features
from fedcore import wire
from fedcore.conditional_valve import GPFLModules
from fedcore.methods.gpfl import GCE_LOSS, MAGNITUDE_LOSS, MODULE_PREFIXES
from fedcore.models import BODY_PREFIX


def conditional_inputs(embeddings: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, p_i): the plain mean of the class embeddings and their mean weighted by the client's class shares."""
    shares = counts.to(embeddings.dtype) / counts.sum()
    return embeddings.mean(0), shares @ embeddings


def angle_guidance_loss(f_global: torch.Tensor, embeddings: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of -log softmax_y(cos(f_G, W_c)): cross-entropy on cosine similarities (no scale)."""
    return F.cross_entropy(F.normalize(f_global) @ F.normalize(embeddings).T, y)


def magnitude_guidance_loss(f_global: torch.Tensor, target: torch.Tensor, lam: float) -> torch.Tensor:
    """lambda * ||f_G - W_y||_2 over the whole batch (one norm of the stacked differences)."""
    return lam * torch.linalg.vector_norm(f_global - target)


class GPFLClient(ClientMethod):
    def received(self, content) -> tuple[torch.nn.Module, GPFLModules]:
        """The client's model (its personal head) with the global body, and the global GCE and CoV."""
        model = self.load_model()
        arrays = wire.torch_arrays(content.array_records[wire.WEIGHTS])
        body = {k: v for k, v in arrays.items() if k.startswith(BODY_PREFIX)}
        extra = set(arrays) - set(body) - {k for k in arrays if k.startswith(MODULE_PREFIXES)}
        if extra:
            raise ValueError(f"received tensors GPFL does not have: {sorted(extra)[:5]}")
        model.load_state_dict(body, strict=False)
        modules = GPFLModules(model.feature_dim, self.data.num_classes).to(self.env.device)
        modules.load_state_dict({k: v for k, v in arrays.items() if k.startswith(MODULE_PREFIXES)})
        return model, modules

    def conditions(self, modules: GPFLModules) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(W frozen, g, p_i) from the received GCE and the client's training class counts."""
        frozen = modules.gce.weight.detach().clone()
        counts = torch.as_tensor(self.data.train_label_counts, device=frozen.device)
        return (frozen, *conditional_inputs(frozen, counts))

    def fit(self, content):
        model, modules = self.received(content)
        frozen, g, p = self.conditions(modules)
        lam, mu = self.hp["lambda"], self.hp["mu"]
        parts: dict[str, list] = {GCE_LOSS: [], MAGNITUDE_LOSS: []}

        def loss_fn(m, xb, yb):
            f = m.features(xb)
            loss = F.cross_entropy(m.head(modules.cov(f, p)), yb)
            f_global = modules.cov(f, g)
            angle = angle_guidance_loss(f_global, modules.gce.weight, yb)
            magnitude = magnitude_guidance_loss(f_global, frozen[yb], lam)
            parts[GCE_LOSS].append(angle.detach())
            parts[MAGNITUDE_LOSS].append(magnitude.detach())
            return loss + angle + magnitude

        optimizers = [self.env.optimizer(model.parameters()),
                      self.env.optimizer(modules.gce.parameters(), weight_decay=mu),
                      self.env.optimizer(modules.cov.parameters(), weight_decay=mu)]
        loss = self.train(model, optimizer=optimizers, loss_fn=loss_fn)
        self.save_model(model)
        shared = {k: v for k, v in model.state_dict().items() if k.startswith(BODY_PREFIX)}
        shared.update(modules.state_dict())
        metrics = {wire.TRAIN_LOSS: loss}
        for name, values in parts.items():
            metrics[wire.METHOD_METRIC_PREFIX + name] = mean_loss(values)
        return {wire.WEIGHTS: wire.pack_arrays(shared)}, metrics

    def evaluate(self, content):
        model, modules = self.received(content)
        _, _, p = self.conditions(modules)
        feats = extract_features(model, self.data.x_test)
        with torch.no_grad():
            return EvalResult(*evaluate_logits(lambda fb: model.head(modules.cov(fb, p)), feats, self.data.y_test))
