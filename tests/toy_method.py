"""A small method that uses every extension point of the base, for the base's own tests.

Server: a preparation phase (round 0) that collects label counts, per-message config values
(a mode and a halving learning rate), a method metric and a matrix per round. Client: a different
hidden width per partition id, a step budget with a callback, an optimiser and a counter kept in
client state, random noise from torch's global generator, and a method evaluation metric.
Registered only inside tests (``toy_registered`` fixture).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from clients.base import ClientMethod, EvalResult
from clients.training import evaluate_model
from fedcore import wire
from fedcore.models import seeded_model
from fedcore.registry import Method
from fedstrategies.base import PersonalizedStrategy
from tests.toy_declaration import RECORD, STEPS_TAG

METHOD = Method.declared_in("tests.toy_declaration", name="toy")  # REGISTRY["toy"]


def lr_for(server_round: int) -> float:
    return 0.1 * 0.5 ** server_round


class ToyStrategy(PersonalizedStrategy):
    checkpoint_attrs = ("seen_counts", "sampled")

    def __init__(self, cfg, clients, model):
        super().__init__(cfg, clients, model)
        self.seen_counts = np.zeros(model.num_classes, np.int64)
        self.sampled: dict[int, list[int]] = {}

    def prepare_targets(self):
        return list(self.clients)

    def prepare_payload(self, pid):
        return {RECORD: wire.pack_arrays({"probe": np.arange(3, dtype=np.float32)})}

    def prepare_config(self, pid):
        return {"mode": "init"}

    def prepare_schema(self, pid):
        return {RECORD: {"counts": (self.num_classes,)}}

    def aggregate_prepare(self, replies):
        for r in replies:
            self.seen_counts += r.arrays[RECORD]["counts"].astype(np.int64)
        return {"classes-seen": int((self.seen_counts > 0).sum())}

    def begin_round(self, server_round, pids):
        self.sampled[server_round] = list(pids)

    def train_config(self, pid, server_round):
        return {"mode": "train", "lr": lr_for(server_round)}

    def reply_schema(self, pid):
        return {RECORD: {"counts": (self.num_classes,)}}

    def aggregate(self, server_round, replies):
        self.record_matrix("eye", np.eye(len(replies)))
        return {"round-sq": server_round ** 2}


class ToyClient(ClientMethod):
    def build_model(self):
        """A different hidden width on every client: per-client architectures in one run."""
        return seeded_model("dnn", self.data.input_shape, self.data.num_classes, self.cfg["seed"],
                            hidden=8 + 4 * self.env.pid)

    def prepare(self, content):
        if self.env.config["mode"] != "init" or self.env.server_round != 0:
            raise RuntimeError(f"prepare got config {self.env.config}")
        return {RECORD: wire.pack_arrays({"counts": self.data.train_label_counts})}, {}

    def fit(self, content):
        config = self.env.config
        if config["mode"] != "train" or abs(self.env.lr - lr_for(self.env.server_round)) > 1e-12:
            raise RuntimeError(f"fit got config {config} and lr {self.env.lr}")
        model = self.load_model()
        optimizer = self.env.optimizer(model.parameters())
        self.env.load_optimizer("optimizer", optimizer)
        counter = self.env.load_scalars("counter") or {"steps": 0}
        calls = []

        def loss_fn(m, xb, yb):  # noise from torch's global generator, seeded per message
            return F.cross_entropy(m(F.dropout(xb, 0.2)), yb)

        loss = self.train(model, steps=self.hp["steps"], optimizer=optimizer, loss_fn=loss_fn,
                          after_step=lambda step, batch_loss, idx: calls.append(step))
        self.save_model(model)
        self.env.save_optimizer("optimizer", optimizer)
        self.env.save_scalars("counter", {"steps": counter["steps"] + len(calls)})
        return ({RECORD: wire.pack_arrays({"counts": self.data.train_label_counts})},
                {wire.TRAIN_LOSS: loss, wire.METHOD_METRIC_PREFIX + STEPS_TAG: counter["steps"] + len(calls)})

    def evaluate(self, content):
        loss, correct, n = evaluate_model(self.load_model(), self.data.x_test, self.data.y_test)
        return EvalResult(loss, correct, n, metrics={"half-acc": correct / max(n, 1) / 2})


