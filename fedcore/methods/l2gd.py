"""L2GD's declaration (see ``fedcore.methods``): message contract and hyperparameters.

server -> client:
    train: ``wire.WEIGHTS`` (the mean model x_bar of the last replies, the initial model in round 1) and
    three config values: how many averaging steps to apply to the client's own model first, how many
    local gradient steps to take after them, and the pull of one averaging step.
    evaluate: nothing (each client scores its own model x_i).
client -> server (train):
    ``wire.WEIGHTS`` (x_i after its local steps).
"""

from __future__ import annotations

from fedcore.config import Key
from fedcore.tuning_grid import product

# ---------------------------------------------------------------- server -> client (config keys)
AVERAGING_STEPS = "l2gd-averaging-steps"  # int >= 0: consecutive averaging steps x_i <- x_i - pull (x_i - x_bar)
LOCAL_STEPS = "l2gd-local-steps"  # int >= 1: consecutive local steps x_i <- x_i - lr grad f_i(x_i)
PULL = "l2gd-pull"  # float in (0, 1]: alpha * lambda / (n p), the share of the way to x_bar of one averaging step

# ---------------------------------------------------------------- method metrics (server side, rounds.csv)
METRIC_AVERAGING_STEPS = "averaging-steps"
METRIC_LOCAL_STEPS = "local-steps"

# ---------------------------------------------------------------- hyperparameters (run-config keys <method>.<key>)
HPARAMS = {
    "p": Key(0.1, "probability that a step of the chain is an averaging step (expected local steps per "
             "round: 1/p)", low=0.0, high=1.0, low_open=True, high_open=True),
    "lambda": Key(1.0, "lambda: weight of the penalty lambda/(2n) sum ||x_i - x_bar||^2 (0 = purely local, "
                  "large = one global model)", low=0.0, low_open=True),
}


# ---------------------------------------------------------------- its record (fedcore.registry, fedcore.tuning_grid)
SUMMARY = "L2GD (Hanzely & Richtarik 2020): loopless local GD with random averaging steps"
STRATEGY = "fedstrategies.l2gd:L2GDStrategy"
CLIENT = "clients.l2gd:L2GDClient"
POSITION = 19  # its row in the registry's order (the README's and docs' method tables)
TUNING_GRID = product(p=[0.05, 0.1, 0.3], **{"lambda": [0.1, 1.0, 10.0]})
