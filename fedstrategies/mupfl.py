"""MuPFL (Zhang et al., extended ICME'23): BAVD on the clients, ACMU and PKCF on the server.

One round (mupfl.md sections 3-4):

- down: the global model, the federated features H (once they exist; the ``has-features`` flag
  says so) and the round's learning rate (``lr`` * ``lr-decay`` ** floor(round / ``lr-decay-every``));
- the client pre-trains its classifier on H (PKCF), trains with BAVD and uploads its model, the
  head it started from, its activation maps and its per-class classifier gradients;
- ACMU: k-means on the combined cosine similarity of the updates and maps, with the cluster count
  chosen by the silhouette score; every client's model becomes its start point plus its cluster's
  mean update, and the global model is their sample-weighted mean;
- PKCF: the per-class gradients are averaged over the clients that report each class and H is
  optimised so that its classifier gradients match them (CReFF's row-wise cosine distance, Adam by
  default; the rule is shared with CReFF in ``fedstrategies/federated_features.py``).

``bavd``, ``acmu`` and ``pkcf`` switch each module off alone (Table VI); ``clusters`` fixes the
cluster count (Tables I and V; with the other two modules off this is "FedAvg with clustering").
The server's rules are in ``fedstrategies/mupfl_math.py``; its declaration (messages, hyperparameters, paper
settings) in ``fedcore/methods/mupfl.py``.
"""

from __future__ import annotations

import numpy as np
import torch

from fedcore import wire
from fedcore.config import ConfigError
from fedcore.methods.mupfl import FEATURES, GRADIENTS, HAS_FEATURES, MAPS, START_HEAD
from fedcore.models import HEAD_PREFIX, bavd_map_shapes, one_torch_thread, seeded_model
from fedstrategies import mupfl_math as mm
from fedstrategies import pairwise, server_device
from fedstrategies.aggregate import weighted_average
from fedstrategies.base import PersonalizedStrategy, weights_schema
from fedstrategies.federated_features import average_class_gradients, match_features


KMEANS_SEED_STREAM = 13


def round_lr(base_lr: float, decay: float, every: int, server_round: int) -> float:
    """The spec's decay ("0.005 every 3 epochs", A8): lr * decay ** floor(round / every)."""
    return base_lr * decay ** (server_round // every)


class MuPFLStrategy(PersonalizedStrategy):
    """Global model + federated features on the server; clustering is re-done every round (no
    cluster state), so the state between rounds is the global model, H and who has trained."""

    checkpoint_attrs = ("global_weights", "features", "has_features", "trained")

    def __init__(self, cfg, clients, model):
        super().__init__(cfg, clients, model)
        if self.hp["max-clusters"] < self.hp["min-clusters"]:
            raise ConfigError(f"mupfl.max-clusters ({self.hp['max-clusters']}) must be >= mupfl.min-clusters "
                              f"({self.hp['min-clusters']})")
        net = seeded_model(model.name, model.input_shape, model.num_classes, cfg["seed"])
        self.param_keys = [k for k, _ in net.named_parameters()]
        self.buffer_keys = [k for k in model.initial_weights if k not in set(self.param_keys)]
        self.head_keys = [k for k in self.param_keys if k.startswith(HEAD_PREFIX)]
        self.map_shapes = bavd_map_shapes(net, model.input_shape) if self.hp["bavd"] else []
        if self.hp["bavd"] and not self.map_shapes:
            raise ConfigError(f"mupfl.bavd = true needs a model with BAVD sites (mupflcnn, resnet8, resnet18); "
                              f"model {model.name!r} has none: choose one of those or set mupfl.bavd = false")
        self.global_weights = {k: v.copy() for k, v in model.initial_weights.items()}
        K, d, m = model.num_classes, model.feature_dim, self.hp["features-per-class"]
        # H ~ N(0, 1), once (CReFF; the paper's f_glo(u_glo) init needs data the server lacks, A5)
        self.features = (torch.randn((K * m, d), generator=self.torch_generator).numpy()
                         if self.hp["pkcf"] else np.zeros((0, d), np.float32))
        self.has_features = False
        self.trained: set[int] = set()  # clients that sent a valid train reply (they keep a model)
        if self.hp["acmu"]:
            mm.load_clustering()  # scikit-learn at start-up, not in the first clustered round

    # ------------------------------------------------------------------ down
    def _payload(self, with_features: bool) -> dict:
        payload = {wire.WEIGHTS: self.packed("global", lambda: wire.pack_arrays(self.global_weights))}
        if with_features:
            payload[FEATURES] = self.packed("features", lambda: wire.pack_arrays({wire.FEATURES: self.features}))
        return payload

    def _config(self, server_round: int, with_features: bool) -> dict:
        lr = round_lr(self.cfg["lr"], self.hp["lr-decay"], self.hp["lr-decay-every"], server_round)
        return {wire.LR: lr, HAS_FEATURES: with_features}

    def train_payload(self, pid, server_round):
        return self._payload(self.has_features)

    def train_config(self, pid, server_round):
        return self._config(server_round, self.has_features)

    def evaluate_payload(self, pid, server_round):
        """A client that never trained evaluates (u_glo, its PKCF head) (mupfl.md 6), so it gets H;
        the others evaluate their own latest model (the global one only if their state is lost)."""
        return self._payload(self.has_features and pid not in self.trained)

    def evaluate_config(self, pid, server_round):
        return self._config(server_round, self.has_features and pid not in self.trained)

    # ------------------------------------------------------------------ up
    def reply_schema(self, pid):
        K, d = self.num_classes, self.model.feature_dim
        schema = {wire.WEIGHTS: weights_schema(self.global_weights)}
        if self.hp["pkcf"]:
            schema[START_HEAD] = {k: self.global_weights[k].shape for k in self.head_keys}
            schema[GRADIENTS] = {"z": (K, K * d + K), "present": (K,)}
        if self.map_shapes:
            schema[MAPS] = {str(i): shape for i, shape in enumerate(self.map_shapes)}
        return schema

    def check_reply(self, reply):
        if reply.num_examples <= 0:
            return "no training samples (num-examples must be positive to weigh a model)"
        if self.hp["pkcf"]:
            present = reply.arrays[GRADIENTS]["present"]
            if not np.isin(present, (0, 1)).all():
                return "class-gradients/present must hold only 0 and 1"
        return None

    # ------------------------------------------------------------------ rules
    def heads_pretrained(self, replies) -> bool:
        """Whether any client started local training from a head other than the global one (PKCF's
        pre-training, decided by the client alone): read from the start heads they sent."""
        if not self.hp["pkcf"]:
            return False
        return any(not np.array_equal(r.arrays[START_HEAD][k], self.global_weights[k])
                   for r in replies for k in self.head_keys)

    def _update_gram(self, replies) -> np.ndarray:
        """<dw_i, dw_j> over all trainable tensors (BN buffers excluded), dw_i = w_i - w_i^start,
        one tensor at a time so that no (clients x parameters) matrix is ever formed; the products on the
        server device (``pairwise.row_gram``)."""
        m = len(replies)
        pretrained = self.heads_pretrained(replies)

        def blocks():
            for key in self.param_keys:
                rows = [r.arrays[wire.WEIGHTS][key].reshape(-1) for r in replies]
                if pretrained and key in self.head_keys:
                    yield rows, np.stack([r.arrays[START_HEAD][key].reshape(-1) for r in replies])
                else:
                    yield rows, self.global_weights[key].reshape(-1)

        return pairwise.row_gram(blocks(), m, capacity=m * max(self.global_weights[k].size for k in self.param_keys))

    def _map_gram(self, replies) -> np.ndarray | None:
        if not self.map_shapes:
            return None
        rows = np.stack([np.concatenate([r.arrays[MAPS][str(i)].reshape(-1) for i in range(len(self.map_shapes))])
                         for r in replies]).astype(np.float64)
        return pairwise.product(rows, rows.T)

    def cluster(self, server_round: int, replies) -> mm.Clustering:
        """ACMU's clusters of this round's clients; without ACMU every client is alone."""
        m = len(replies)
        if not self.hp["acmu"]:
            return mm.Clustering(np.arange(m), m, 0.0)
        similarity = mm.combined_similarity(self._update_gram(replies), self._map_gram(replies), self.hp["alpha-s"])
        seed = int(np.random.SeedSequence([self.cfg["seed"], server_round, KMEANS_SEED_STREAM]).generate_state(1)[0])
        return mm.choose_clusters(similarity, self.hp["min-clusters"], self.hp["max-clusters"], seed,
                                  fixed=self.hp["clusters"])

    def aggregate(self, server_round, replies):
        n = np.array([r.num_examples for r in replies], dtype=np.float64)
        self.trained.update(r.pid for r in replies)
        clustering = self.cluster(server_round, replies)
        omega = mm.cluster_weights(clustering.labels, n)
        v_ref = {k: self.global_weights[k].copy() for k in self.head_keys}  # the head the clients received
        weights = [r.arrays[wire.WEIGHTS] for r in replies]
        # Eqs. 14-15: sum_i (n_i/n) w_i^start + sum_i (omega_i/n) dw_i. Bodies start equal (so do
        # heads without PKCF pre-training), and sum omega_i = n: the omega-weighted mean of the
        # client models; pre-trained heads add sum_i (n_i - omega_i)/n v_i.
        new = weighted_average(({k: w[k] for k in self.param_keys} for w in weights), omega)
        if self.heads_pretrained(replies):
            heads = [r.arrays[START_HEAD] for r in replies]
            by_n, by_omega = weighted_average(heads, n), weighted_average(heads, omega)
            for k in self.head_keys:
                new[k] = (new[k] + (by_n[k] - by_omega[k])).astype(new[k].dtype)
        if self.buffer_keys:  # BN running statistics: sample-weighted mean (PROPOSED)
            new.update(weighted_average(({k: w[k] for k in self.buffer_keys} for w in weights), n))
        self.global_weights = {k: new[k] for k in self.global_weights}
        self.record_matrix("clusters", np.array([[r.pid for r in replies], clustering.labels.tolist()]))
        metrics = {"clusters": clustering.count, "silhouette": clustering.silhouette}
        if self.hp["pkcf"]:
            metrics.update(self.match(replies, v_ref))
        return metrics

    def match(self, replies, v_ref: dict[str, np.ndarray]) -> dict:
        """PKCF on the server: H moves to match the replies' per-class gradients (``matched_features``)."""
        matched = self.matched_features(
            ((r.arrays[GRADIENTS]["z"], r.arrays[GRADIENTS]["present"]) for r in replies), v_ref)
        if matched is None:
            return {"match-loss-before": 0.0, "match-loss": 0.0}
        self.features, before, after = matched
        self.has_features = True
        return {"match-loss-before": before, "match-loss": after}

    def matched_features(self, gradients, v_ref: dict[str, np.ndarray]) -> tuple[np.ndarray, float, float] | None:
        """Average the per-class gradients (Eq. 17) of ``gradients`` ((Z_i, present_i) pairs) and move a copy of
        H to match them at the head ``v_ref``. Returns (the new H, the distance before, after), or None when there
        is nothing to match. Changes no state (the server-time benchmark times it alone)."""
        z, reported = average_class_gradients(gradients)
        m = self.hp["features-per-class"]
        if m == 0 or not reported.any():
            return None
        device = server_device.current()  # on the server device; on the CPU the tensors share numpy's memory
        features = torch.from_numpy(self.features.copy()).to(device)
        weight, bias = (torch.from_numpy(v_ref[k]).to(device) for k in (HEAD_PREFIX + "weight", HEAD_PREFIX + "bias"))
        with one_torch_thread():  # (K*m x d) matrices: threads cost more than they give (fedcore.models)
            before, after = match_features(features, torch.from_numpy(z.astype(np.float32)).to(device),
                                           torch.from_numpy(reported).to(device), weight, bias, self.hp["match-steps"],
                                           self.hp["match-lr"], self.hp["match-optimizer"])
        return server_device.to_host(features), before, after
