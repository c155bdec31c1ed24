"""pFedPM client: a private model (body + decision head) and a private relation module, trained on
mixed local/global class features; only per-class mean features leave the client.

One round (spec section 3):

1. Mixed features (Eq. 8), once per round and held fixed: C̃^(j) = a C_prev^(j) + (1 - a) C̄^(j) for a
   local class the server knows, C̄^(j) for a class missing locally, C_prev^(j) for a local class the
   server does not know yet. C_prev are the local features of the previous round (in round 1: of the
   initial body). Building C̃ from the *current* features would make L_R = (1 - a)||C̄ - C|| and reduce a
   to a rescaling of lambda; the paper's alternating minimisation fixes C̃ while w moves.
2. Per mini-batch (Alg. 1): one SGD step on body + head with CE + lambda L_R (Eq. 9-11; L_R off while
   the server has no global features), then one SGD step on the relation module with the body fixed:
   MSE of its scores for every candidate class against the one-hot label (Eq. 12-13).
3. Local features (Eq. 6) over the whole training set, in eval mode: stored for the next round and
   uploaded with the class counts.

Evaluation reports both predictions: the decision head (pFedPM, the run's accuracy) and the relation
module over the mixed features of the last training round (R-pFedPM, metric ``relation-acc``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from clients.base import ClientMethod, EvalResult
from clients.training import class_means, evaluate_features, extract_features
from fedcore import wire
from fedcore.methods.pfedpm import FEATURE_REG, GLOBAL_FEATURES, HAS_GLOBAL, RELATION_ACC, RELATION_LOSS
from fedcore.models import heterogeneous_kwargs, resolve_model_name, seed_torch, seeded_model

# client state names
MODEL, RELATION = "model", "relation"
OPTIMIZER, RELATION_OPTIMIZER = "optimizer", "relation-optimizer"
LOCAL_FEATURES, MIXED_FEATURES = "local-features", "mixed-features"
RELATION_SEED_TAG = 101  # the relation module's initial weights: seeded apart from the model's
MAX_PAIR_VALUES = 1 << 19  # relation scoring in chunks of at most this many pair values (pairs * d)


class RelationModule(nn.Module):
    """g_psi: the score in [0, 1] that a feature h belongs to the class of a class feature c.

    The paper gives only "one convolutional layer and two fully connected layers"; the shape is the
    spec's [PROPOSED] one, in the style of Sung et al.'s relation network: stack (h, c) as a (2, d)
    signal -> Conv1d(2, 64, 3) -> BN -> ReLU -> MaxPool(2) -> Linear(64 * (d // 2), 8) -> ReLU ->
    Linear(8, 1) -> Sigmoid.
    """

    def __init__(self, feature_dim: int, channels: int = 64, hidden: int = 8):
        super().__init__()
        self.feature_dim = int(feature_dim)
        self.conv = nn.Sequential(nn.Conv1d(2, channels, 3, padding=1), nn.BatchNorm1d(channels), nn.ReLU(),
                                  nn.MaxPool1d(2), nn.Flatten())
        self.fc = nn.Sequential(nn.Linear(channels * (self.feature_dim // 2), hidden), nn.ReLU(),
                                nn.Linear(hidden, 1), nn.Sigmoid())

    def forward(self, pairs: torch.Tensor) -> torch.Tensor:
        """(N, 2, d) stacked (feature, class feature) pairs -> (N,) scores."""
        return self.fc(self.conv(pairs)).squeeze(1)

    def scores(self, h: torch.Tensor, class_features: torch.Tensor) -> torch.Tensor:
        """(B, K) scores of every feature (B, d) against every class feature (K, d) (Eq. 13)."""
        b, k, d = len(h), len(class_features), self.feature_dim
        pairs = torch.stack([h[:, None, :].expand(b, k, d), class_features[None].expand(b, k, d)], dim=2)
        return self(pairs.reshape(b * k, 2, d)).view(b, k)


def mix_features(local_ids: torch.Tensor, local: torch.Tensor, global_ids: torch.Tensor | None,
                 global_feats: torch.Tensor | None, a: float, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 8 with the spec's cases for classes only one side has.

    Returns the candidate classes K (sorted ids) and their mixed features (|K|, d):
    a * local + (1 - a) * global where both exist, the global feature for a class missing locally, the
    local feature for a class without a global one (round 1, or a class nobody else holds yet).
    """
    d = local.shape[1]
    table_local = local.new_zeros(num_classes, d)
    table_local[local_ids] = local
    has_local = torch.zeros(num_classes, dtype=torch.bool, device=local.device)
    has_local[local_ids] = True
    table_global = local.new_zeros(num_classes, d)
    has_global = torch.zeros_like(has_local)
    if global_ids is not None and len(global_ids):
        table_global[global_ids] = global_feats
        has_global[global_ids] = True
    both = a * table_local + (1.0 - a) * table_global
    mixed = torch.where(has_global[:, None], torch.where(has_local[:, None], both, table_global), table_local)
    ids = (has_local | has_global).nonzero().flatten()
    return ids, mixed[ids]


def batch_class_means(h: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The classes j present in the batch and m_j, the batch's mean feature of each (Alg. 1: Eq. 6 per batch)."""
    classes, inverse = torch.unique(y, return_inverse=True)
    sums = h.new_zeros(len(classes), h.shape[1]).index_add_(0, inverse, h)
    return classes, sums / torch.bincount(inverse, minlength=len(classes)).unsqueeze(1).to(h.dtype)


def l2_regulariser(h: torch.Tensor, y: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """L_R as the spec reads Eq. 11: the mean over the classes j in the batch of ||C̃^(j) - m_j||_2
    (unsquared). ``table`` is (C, d), row j = C̃^(j)."""
    classes, means = batch_class_means(h, y)
    return (table[classes] - means).norm(dim=1).mean()


def l2sq_regulariser(h: torch.Tensor, y: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``l2`` with the distance squared: its pull fades as m_j nears C̃^(j), where the unsquared
    distance pulls with the same strength at any distance."""
    classes, means = batch_class_means(h, y)
    return (table[classes] - means).pow(2).sum(dim=1).mean()


def fedproto_regulariser(h: torch.Tensor, y: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """L_R as FedProto's code computes it: MSE between each feature and its class's C̃, over samples and dims."""
    return F.mse_loss(h, table[y])


REGULARISERS = {"l2": l2_regulariser, "l2sq": l2sq_regulariser, "fedproto": fedproto_regulariser}


def logits_of(model: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """The decision module on features: the model's own ``classify`` (protocnn's Dropout + Linear), else its head."""
    return model.classify(h) if hasattr(model, "classify") else model.head(h)


class PFedPMClient(ClientMethod):
    # ------------------------------------------------------------------ models
    def build_model(self):
        """pFedPM-mh: the conv width (or ResNet stem strides) of this client's group of partition ids."""
        kwargs = {}
        if self.hp["heterogeneous"]:
            name = resolve_model_name(self.cfg["model"], self.data.input_shape)
            kwargs = heterogeneous_kwargs(name, self.env.pid, self.env.num_clients)
        return seeded_model(self.cfg["model"], self.data.input_shape, self.data.num_classes, self.cfg["seed"],
                            **kwargs)

    def load_relation(self, feature_dim: int) -> RelationModule:
        with torch.random.fork_rng(devices=[]):
            seed_torch(self.cfg["seed"] * 1000 + RELATION_SEED_TAG)
            relation = RelationModule(feature_dim)
        relation.to(self.env.device)
        self.env.load_module(RELATION, relation)
        return relation

    def optimizer_for(self, name: str, module: nn.Module) -> torch.optim.Optimizer:
        """SGD at the run's lr and momentum (0.01 and 0.5 in the paper), its momentum kept across rounds."""
        optimizer = self.env.optimizer(module.parameters())
        self.env.load_optimizer(name, optimizer)
        return optimizer

    # ------------------------------------------------------------------ features
    def local_features(self, model: nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Eq. 6: (class ids, class-mean features, counts) over the whole training set, in eval mode."""
        return class_means(extract_features(model, self.data.x_train), self.data.y_train, self.data.num_classes)

    def _stored(self, name: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        arrays = self.env.load_arrays(name)
        if arrays is None:
            return None
        dev = self.env.device
        return wire.to_device(arrays[wire.CLASS_IDS], dev), wire.to_device(arrays[wire.FEATURES], dev)

    def _store(self, name: str, ids: torch.Tensor, feats: torch.Tensor) -> None:
        self.env.save_arrays(name, {wire.CLASS_IDS: ids.to(torch.int64), wire.FEATURES: feats.to(torch.float32)})

    def global_features(self, content) -> tuple[torch.Tensor, torch.Tensor] | None:
        """G from the train message, or None when the server says it has none yet."""
        if not self.env.config[HAS_GLOBAL]:
            return None
        arrays = wire.unpack_arrays(content.array_records[GLOBAL_FEATURES])
        dev = self.env.device  # to_device copies the read-only views
        return wire.to_device(arrays[wire.CLASS_IDS], dev), wire.to_device(arrays[wire.FEATURES], dev)

    # ------------------------------------------------------------------ the two steps
    def body_head_loss(self, table: torch.Tensor | None, reg_log: list):
        """CE + lambda * L_R (Eq. 9) on body + head; ``table`` (C, d) holds C̃ by class, None = L_R off."""
        lam, regulariser = self.hp["lambda"], REGULARISERS[self.hp["reg"]]

        def loss_fn(model, xb, yb):
            h = model.features(xb)
            loss = F.cross_entropy(logits_of(model, h), yb)
            if table is not None:
                reg = regulariser(h, yb, table)
                reg_log.append(reg.detach())
                loss = loss + lam * reg
            return loss

        return loss_fn

    def relation_step(self, model: nn.Module, relation: RelationModule, optimizer: torch.optim.Optimizer,
                      xb: torch.Tensor, yb: torch.Tensor, ids: torch.Tensor, mixed: torch.Tensor) -> torch.Tensor:
        """One step on the relation module only (Eq. 12): the body is fixed (no grad, eval mode, so its
        BatchNorm statistics and parameters stay bit-identical), scores against every candidate class,
        plain squared error to the one-hot label, averaged over samples and classes."""
        was_training = model.training
        model.eval()
        with torch.no_grad():
            z = model.features(xb)
        model.train(was_training)
        relation.train()
        optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(relation.scores(z, mixed), (yb[:, None] == ids[None, :]).to(z.dtype))
        loss.backward()
        optimizer.step()
        return loss.detach()

    # ------------------------------------------------------------------ interface
    def fit(self, content):
        model = self.load_model(MODEL)
        relation = self.load_relation(model.feature_dim)
        optimizer = self.optimizer_for(OPTIMIZER, model)
        relation_optimizer = self.optimizer_for(RELATION_OPTIMIZER, relation)

        previous = self._stored(LOCAL_FEATURES)
        if previous is None:  # round 1 (or lost state): the current body's features stand in for C_prev
            previous = self.local_features(model)[:2]
        received = self.global_features(content)
        ids, mixed = mix_features(*previous, *(received or (None, None)), self.hp["a"], self.data.num_classes)

        use_reg = received is not None and self.hp["lambda"] > 0
        table = None
        if use_reg:
            table = mixed.new_zeros(self.data.num_classes, mixed.shape[1])
            table[ids] = mixed
        reg_log, relation_log = [], []
        x, y = self.data.x_train, self.data.y_train

        def after_step(step, loss, idx):
            relation_log.append(self.relation_step(model, relation, relation_optimizer, x[idx], y[idx], ids, mixed))

        loss = self.train(model, optimizer=optimizer, loss_fn=self.body_head_loss(table, reg_log),
                          after_step=after_step)

        local_ids, local, counts = self.local_features(model)
        self.save_model(model, MODEL)
        self.env.save_module(RELATION, relation)
        self.env.save_optimizer(OPTIMIZER, optimizer)
        self.env.save_optimizer(RELATION_OPTIMIZER, relation_optimizer)
        self._store(LOCAL_FEATURES, local_ids, local)
        self._store(MIXED_FEATURES, ids, mixed)
        metrics = {
            wire.TRAIN_LOSS: loss,
            wire.METHOD_METRIC_PREFIX + RELATION_LOSS: float(torch.stack(relation_log).mean()) if relation_log else 0.0,
            wire.METHOD_METRIC_PREFIX + FEATURE_REG: float(torch.stack(reg_log).mean()) if reg_log else 0.0,
        }
        upload = wire.pack_class_features(*map(wire.to_host, (local_ids, local, counts)))
        return {wire.CLASS_FEATURES: upload}, metrics

    def evaluate(self, content):
        model = self.load_model(MODEL)
        loss, correct, n, h = evaluate_features(model, self.data.x_test, self.data.y_test)
        relation = self.load_relation(model.feature_dim)
        mixed = self._stored(MIXED_FEATURES)
        if mixed is None:  # never trained: the current body's own class features
            mixed = self.local_features(model)[:2]
        ids, feats = mixed
        relation_correct = 0  # evaluate_features has already failed on an empty test split: n >= 1 here
        if len(ids):
            relation.eval()
            chunk = max(1, MAX_PAIR_VALUES // (len(ids) * model.feature_dim))
            with torch.no_grad():
                pred = torch.cat([ids[relation.scores(h[s:s + chunk], feats).argmax(1)]
                                  for s in range(0, n, chunk)])
            relation_correct = int((pred == self.data.y_test).sum())
        return EvalResult(loss, correct, n, {RELATION_ACC: relation_correct / n})
