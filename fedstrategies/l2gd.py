"""L2GD (Hanzely & Richtarik 2020, "Federated learning of a mixture of global and local models").

It minimises F(x) = 1/n sum_i f_i(x_i) + lambda/(2n) sum_i ||x_i - x_bar||^2 by loopless local gradient
descent (Algorithm 1): at each step a shared coin says, with probability 1 - p, "local step"
x_i <- x_i - alpha/(n (1 - p)) grad f_i(x_i) on every client, and with probability p "averaging step"
x_i <- x_i - alpha lambda/(n p) (x_i - x_bar). Its expected step is a gradient step on F.

Communication is needed only at the first averaging step after local ones, so one Flower round here is
one such run of the chain: the server draws how many averaging steps (m >= 1; 0 in round 1, when every
x_i is still x_bar) and then local steps (k >= 1) the coin gives, sends x_bar with (m, k), and takes the
uniform mean of the returned x_i as the next x_bar (x_bar does not move during averaging steps). The
run's ``lr`` is the local step size alpha/(n (1 - p)), so the pull of an averaging step is
alpha lambda/(n p) = lr * lambda * (1 - p) / p, which must not pass 1 (beyond it the step overshoots x_bar).
"""

from __future__ import annotations

import numpy as np

from fedcore import wire
from fedcore.config import ConfigError
from fedcore.methods.l2gd import (AVERAGING_STEPS, LOCAL_STEPS, METRIC_AVERAGING_STEPS, METRIC_LOCAL_STEPS,
                                    PULL)
from fedstrategies.aggregate import weighted_average
from fedstrategies.fedavg import FedAvgStrategy

SCHEDULE_STREAM = 23  # the coin's own random stream, apart from client sampling's


def averaging_pull(lr: float, lam: float, p: float) -> float:
    """alpha lambda / (n p) with alpha = lr * n * (1 - p): the share of the way to x_bar of one averaging step."""
    return lr * lam * (1.0 - p) / p


def round_schedule(seed: int, server_round: int, p: float) -> tuple[int, int]:
    """(averaging steps m, local steps k) of one round of the coin chain, seeded by (seed, round).

    A run of averaging steps ends at the first local step: m ~ Geometric(1 - p); a run of local steps ends at
    the first averaging step: k ~ Geometric(p). Round 1 starts from identical models, where averaging is
    a no-op, so its m is 0.
    """
    rng = np.random.default_rng([seed, server_round, SCHEDULE_STREAM])
    m = int(rng.geometric(1.0 - p))
    k = int(rng.geometric(p))
    return (0 if server_round == 1 else m), k


class L2GDStrategy(FedAvgStrategy):
    """x_bar down with the round's (m, k); the clients' own models up; clients score their own models."""

    def __init__(self, cfg, clients, model):
        super().__init__(cfg, clients, model)
        self.pull = averaging_pull(cfg["lr"], self.hp["lambda"], self.hp["p"])
        if self.pull > 1.0:
            raise ConfigError(f"'l2gd.lambda' = {self.hp['lambda']}, 'l2gd.p' = {self.hp['p']} and 'lr' = {cfg['lr']} "
                              f"give an averaging step of lr * lambda * (1 - p) / p = {self.pull:.4g}, beyond 1 "
                              "(it would overshoot the mean); lower lambda or lr, or raise p")

    def train_config(self, pid, server_round):
        m, k = round_schedule(self.cfg["seed"], server_round, self.hp["p"])
        return {AVERAGING_STEPS: m, LOCAL_STEPS: k, PULL: self.pull}

    def aggregate(self, server_round, replies):
        self.global_weights = weighted_average((r.arrays[wire.WEIGHTS] for r in replies), [1.0] * len(replies))
        m, k = round_schedule(self.cfg["seed"], server_round, self.hp["p"])
        return {METRIC_AVERAGING_STEPS: m, METRIC_LOCAL_STEPS: k}

    def evaluate_payload(self, pid, server_round):
        return {}
