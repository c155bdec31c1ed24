"""L2GD's message contract (see ``fedcore.contracts``).

server -> client:
    train: ``wire.WEIGHTS`` (the mean model x_bar of the last replies, the initial model in round 1) and
    three config values: how many averaging steps to apply to the client's own model first, how many
    local gradient steps to take after them, and the pull of one averaging step.
    evaluate: nothing (each client scores its own model x_i).
client -> server (train):
    ``wire.WEIGHTS`` (x_i after its local steps).
"""

# ---------------------------------------------------------------- server -> client (config keys)
AVERAGING_STEPS = "l2gd-averaging-steps"  # int >= 0: consecutive averaging steps x_i <- x_i - pull (x_i - x_bar)
LOCAL_STEPS = "l2gd-local-steps"  # int >= 1: consecutive local steps x_i <- x_i - lr grad f_i(x_i)
PULL = "l2gd-pull"  # float in (0, 1]: alpha * lambda / (n p), the share of the way to x_bar of one averaging step

# ---------------------------------------------------------------- method metrics (server side, rounds.csv)
METRIC_AVERAGING_STEPS = "averaging-steps"
METRIC_LOCAL_STEPS = "local-steps"
