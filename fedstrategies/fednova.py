"""FedNova (Wang, Liu, Liang, Joshi, Poor, NeurIPS 2020): normalised averaging.

Clients that take different numbers of local steps pull plain FedAvg towards the optimum of the
clients that took more. FedNova divides each client's update by its effective step count ||a_i||_1
(momentum included, fedcore/methods/fednova.py) and re-scales the mean by tau_eff = sum_i p_i ||a_i||_1:
    x <- x - tau_eff * sum_i p_i (x - y_i) / ||a_i||_1,   p_i = n_i / sum_j n_j over the replies
(Eq. 6 with the paper's experiments' weights). Equal step counts give FedAvg exactly. With
``max-epochs`` each sampled client runs a number of local epochs drawn uniformly from local-epochs..max-epochs
every round, the paper's heterogeneous setting (2..5 epochs on CIFAR-10).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from fedcore import wire
from fedcore.config import ConfigError
from fedcore.methods.fednova import A_NORM, EPOCHS, NORMALIZER, effective_steps
from fedstrategies.aggregate import weighted_average
from fedstrategies.base import ArraySpec
from fedstrategies.fedavg import FedAvgStrategy

EPOCH_STREAM = 29  # the epoch draws' own random stream


def normalized_average(current: dict[str, np.ndarray], states: Sequence[dict[str, np.ndarray]],
                       sizes: Sequence[float], a_norms: Sequence[float]) -> dict[str, np.ndarray]:
    """x - tau_eff sum_i p_i (x - y_i) / a_i for float tensors; integer tensors (counters) take the maximum.

    Computed as x - c (x - S), with q_i = p_i / a_i, S the q-weighted mean of the y_i and c = tau_eff sum_i q_i:
    S is FedAvg's streamed weighted mean (``weighted_average``, kept in float64), so the states are read once and
    no per-client temporary is made."""
    p = np.array(sizes) / np.sum(sizes)
    a = np.array(a_norms)
    tau_eff = float(np.sum(p * a))
    q = p / a
    c = tau_eff * float(q.sum())
    mean = weighted_average(states, q, float64=True)
    out = {}
    for key, x in current.items():
        if x.dtype.kind != "f":
            out[key] = mean[key].astype(x.dtype)
            continue
        out[key] = (x - c * (x - mean[key])).astype(x.dtype)  # mean is float64: so is every step
    return out


class FedNovaStrategy(FedAvgStrategy):
    """FedAvg's messages plus each client's epochs down and its ||a_i||_1 up; the normalised average."""

    def __init__(self, cfg, clients, model):
        super().__init__(cfg, clients, model)
        most = self.hp["max-epochs"]
        if most and cfg["local-steps"]:
            raise ConfigError(f"'fednova.max-epochs' = {most} draws local epochs, but 'local-steps' = "
                              f"{cfg['local-steps']} fixes a step budget; set local-steps = 0 or max-epochs = 0")
        if most and most < cfg["local-epochs"]:
            raise ConfigError(f"'fednova.max-epochs' = {most} is below 'local-epochs' = {cfg['local-epochs']}; "
                              "it must be 0 or at least local-epochs")

    def epochs_of(self, pid: int, server_round: int) -> int:
        low, high = self.cfg["local-epochs"], self.hp["max-epochs"]
        if not high:
            return low
        return int(np.random.default_rng([self.cfg["seed"], server_round, pid, EPOCH_STREAM]).integers(low, high + 1))

    def train_config(self, pid, server_round):
        return {EPOCHS: self.epochs_of(pid, server_round)}

    def reply_schema(self, pid):
        return {**super().reply_schema(pid), NORMALIZER: {A_NORM: ArraySpec((1,), "f")}}

    def most_steps(self, pid: int) -> float:
        """The largest ||a_i||_1 client ``pid`` can reach: its full step budget at the run's momentum."""
        tau = self.cfg["local-steps"]
        if not tau:
            epochs = max(self.cfg["local-epochs"], self.hp["max-epochs"])
            tau = epochs * math.ceil(self.clients[pid].num_train / self.cfg["batch-size"])
        return effective_steps(tau, self.cfg["momentum"])

    def check_reply(self, reply):
        a = float(reply.arrays[NORMALIZER][A_NORM][0])
        most = self.most_steps(reply.pid)
        if not 1.0 <= a <= most * (1 + 1e-9):
            return f"{NORMALIZER}/{A_NORM} = {a:.6g} is outside 1..{most:.6g} (one step .. the client's full budget)"
        return None

    def aggregate(self, server_round, replies):
        self.global_weights = normalized_average(self.global_weights, [r.arrays[wire.WEIGHTS] for r in replies],
                                                 [r.num_examples for r in replies],
                                                 [float(r.arrays[NORMALIZER][A_NORM][0]) for r in replies])
