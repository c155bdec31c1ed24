"""FedFCD client: personal extractor theta_i and personal head phi_i, fused with the server's global head.

Logits are s = g + p with g = phi_g(z) (global head, frozen on clients) and p = phi_i(z), z = theta_i(x)
(Eq. 7-8: an element-wise sum of raw logits, no weight; softmax comes with the cross-entropy).
One round of local training ("hierarchical optimisation", Eq. 9-10, Algorithm 1), per local epoch:

- stage A: theta_i <- theta_i - eta_f * grad_theta [CE(s, y) + R_i], both heads frozen but with
  gradients flowing through them to z; R_i = lambda * mean over the batch and the d feature
  dimensions of (z - GFR_y)^2 (Eq. 6), a sample whose class has no GFR adding 0;
- stage B: phi_i <- phi_i - eta_phi_i * grad_phi CE(s, y) on features of the updated extractor,
  computed once in eval mode without gradients (theta_i and its buffers stay fixed).

Then the client uploads its LFRs: per-class mean features of the final extractor over its whole
training set, in eval mode (Eq. 3), with the class sizes. Prediction is argmax(g + p).
Ablations (Table 3): ``feature-alignment`` false drops R_i; ``decision-fusion`` false uses s = p
in training and inference; ``hierarchical`` false takes one joint step on theta_i and phi_i per
mini-batch with CE(s, y) + R_i.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from clients.base import ClientMethod, EvalResult
from clients.training import class_means, evaluate_logits, extract_features
from fedcore import wire
from fedcore.methods.fedfcd import ALIGNMENT_LOSS, GLOBAL_HEAD, HEAD_LOSS


@dataclass(frozen=True)
class GlobalKnowledge:
    """What the server sent: phi_g as constant tensors and the GFR table with its presence mask."""

    weight: torch.Tensor  # (C, d)
    bias: torch.Tensor  # (C,)
    gfr: torch.Tensor  # (C, d); rows without a GFR are zero
    has_gfr: torch.Tensor  # (C,) float 0/1

    def logits(self, z: torch.Tensor) -> torch.Tensor:
        """g = h^G(phi_g; z)."""
        return F.linear(z, self.weight, self.bias)


def fused_logits(z: torch.Tensor, personal_head: torch.nn.Module, known: GlobalKnowledge,
                 fusion: bool = True) -> torch.Tensor:
    """s = h^G(phi_g; z) + h^P(phi_i; z) (Eq. 8), or p alone without decision fusion."""
    p = personal_head(z)
    return known.logits(z) + p if fusion else p


def alignment_loss(z: torch.Tensor, y: torch.Tensor, known: GlobalKnowledge, lam: float) -> torch.Tensor:
    """R_i (Eq. 6): lambda * (1/|B|) sum_b (1/d) ||z_b - GFR_{y_b}||^2, i.e. lambda * MSE with mean
    reduction; samples whose class has no GFR contribute 0 and the normaliser stays |B| * d. The GFR
    is a constant (no gradient)."""
    diff = (z - known.gfr[y]) * known.has_gfr[y].unsqueeze(1)
    return lam * diff.pow(2).mean()


class FedFCDClient(ClientMethod):
    # ------------------------------------------------------------ what the server sent
    def global_knowledge(self, content) -> GlobalKnowledge:
        head = wire.unpack_arrays(content.array_records[GLOBAL_HEAD])
        c, d = head["weight"].shape
        dev = self.env.device
        gfr = torch.zeros(c, d, device=dev)
        has = torch.zeros(c, device=dev)
        if wire.CLASS_FEATURES in content.array_records:  # train messages; evaluation needs only phi_g
            ids, feats, _ = wire.unpack_class_features(content.array_records[wire.CLASS_FEATURES])
            ids = wire.to_device(ids, dev)  # copies of read-only views
            gfr[ids] = wire.to_device(feats, dev)
            has[ids] = 1.0
        return GlobalKnowledge(wire.to_device(head["weight"], dev), wire.to_device(head["bias"], dev),
                               gfr, has)

    # ------------------------------------------------------------ the two objectives
    def objective(self, known: GlobalKnowledge, parts: list | None = None):
        """Stage A's (and the joint step's) loss: CE(s, y) + R_i; ``parts`` collects R_i per batch."""
        lam = self.hp["lambda"] if self.hp["feature-alignment"] else 0.0
        fusion = self.hp["decision-fusion"]

        def loss_fn(model, xb, yb):
            z = model.features(xb)
            loss = F.cross_entropy(fused_logits(z, model.head, known, fusion), yb)
            if lam > 0:
                r = alignment_loss(z, yb, known, lam)
                if parts is not None:
                    parts.append(r.detach())
                loss = loss + r
            return loss

        return loss_fn

    def head_objective(self, known: GlobalKnowledge):
        """Stage B's loss on precomputed features: CE(s, y) as a function of phi_i only."""
        fusion = self.hp["decision-fusion"]
        return lambda head, zb, yb: F.cross_entropy(fused_logits(zb, head, known, fusion), yb)

    # ------------------------------------------------------------ the stages
    def budget(self) -> tuple[int, dict]:
        """(alternations, per-stage budget): ``local-epochs`` alternations of one epoch per stage, or
        with ``local-steps`` one alternation of that many steps per stage."""
        steps = self.cfg["local-steps"]
        return (1, {"steps": steps}) if steps > 0 else (self.cfg["local-epochs"], {"epochs": 1})

    def stage_a(self, model, known, optimizer, tag: int, parts=None, after_step=None, **budget) -> float:
        """Fix phi_i (and phi_g), update theta_i (Eq. 9): train mode, gradients flow through both heads."""
        with self.frozen([model.head]):
            return self.train(model, optimizer=optimizer, loss_fn=self.objective(known, parts), tag=tag,
                              after_step=after_step, **budget)

    def stage_b(self, model, known, optimizer, tag: int, **budget) -> float:
        """Fix theta_i, update phi_i (Eq. 10): the extractor's features once, in eval mode, no grad."""
        feats = extract_features(model, self.data.x_train)
        return self.train(model.head, x=feats, optimizer=optimizer, loss_fn=self.head_objective(known), tag=tag,
                          **budget)

    def per_batch_head_step(self, model, known, optimizer):
        """The ``alternation = "batch"`` variant: after each extractor step, one personal-head step on
        the same mini-batch, with features of the updated extractor in eval mode."""
        head_loss = self.head_objective(known)
        x, y = self.data.x_train, self.data.y_train

        def step(_, __, idx):
            model.eval()
            with torch.no_grad():
                z = model.features(x[idx])
            model.train()
            model.head.requires_grad_(True)
            optimizer.zero_grad(set_to_none=True)
            head_loss(model.head, z, y[idx]).backward()
            optimizer.step()
            model.head.requires_grad_(False)

        return step

    def learning_rates(self) -> tuple[float, float]:
        """(eta_f, eta_phi_i): the message's common lr unless ``lr-feature`` / ``lr-personal-head`` set one."""
        return self.hp["lr-feature"] or self.env.lr, self.hp["lr-personal-head"] or self.env.lr

    def local_update(self, model, known: GlobalKnowledge) -> dict:
        """One round of local training on (theta_i, phi_i) = (model.body, model.head); returns metrics."""
        hp = self.hp
        eta_f, eta_phi = self.learning_rates()
        opt_theta = self.env.optimizer(model.body.parameters(), lr=eta_f)
        opt_phi = self.env.optimizer(model.head.parameters(), lr=eta_phi)
        alternations, budget = self.budget()
        whole = budget if "steps" in budget else {"epochs": alternations}  # the same budget as one pass
        parts: list = []
        metrics = {}
        if not hp["hierarchical"]:  # w/o HO: joint steps on theta_i and phi_i
            loss = self.train(model, optimizer=[opt_theta, opt_phi], loss_fn=self.objective(known, parts), **whole)
        elif hp["alternation"] == "batch":
            loss = self.stage_a(model, known, opt_theta, tag=0, parts=parts,
                                after_step=self.per_batch_head_step(model, known, opt_phi), **whole)
        else:
            for epoch in range(alternations):
                parts.clear()
                loss = self.stage_a(model, known, opt_theta, tag=2 * epoch, parts=parts, **budget)
                metrics[HEAD_LOSS] = self.stage_b(model, known, opt_phi, tag=2 * epoch + 1, **budget)
        if parts:
            metrics[ALIGNMENT_LOSS] = float(torch.stack(parts).mean())
        return {wire.TRAIN_LOSS: loss, **{wire.METHOD_METRIC_PREFIX + k: v for k, v in metrics.items()}}

    # ------------------------------------------------------------ the message handlers
    def lfr_upload(self, model) -> dict:
        """Per-class mean features of the whole training set (Eq. 3), eval mode, no grad, with counts."""
        ids, means, counts = class_means(extract_features(model, self.data.x_train), self.data.y_train,
                                         self.data.num_classes)
        return {wire.CLASS_FEATURES: wire.pack_class_features(*map(wire.to_host, (ids, means, counts)))}

    def prepare(self, content):
        """Round 0: the LFRs of the untrained extractor theta_i(0), the seeded initial one."""
        return self.lfr_upload(self.load_model()), {}

    def fit(self, content):
        model = self.load_model()  # theta_i and phi_i from this client's last round, else the initial model
        metrics = self.local_update(model, self.global_knowledge(content))
        self.save_model(model)
        return self.lfr_upload(model), metrics

    def evaluate(self, content):
        model = self.load_model().eval()
        known = self.global_knowledge(content)
        fusion = self.hp["decision-fusion"]
        loss, correct, n = evaluate_logits(lambda x: fused_logits(model.features(x), model.head, known, fusion),
                                           self.data.x_test, self.data.y_test)
        return EvalResult(loss, correct, n)
