"""FedNova's declaration (see ``fedcore.methods``): message contract and hyperparameters.

server -> client:
    train: ``wire.WEIGHTS`` (the global model x) and ``EPOCHS`` (this client's local epochs this round);
    evaluate: ``wire.WEIGHTS``.
client -> server (train):
    ``wire.WEIGHTS`` (y_i after local training) and ``NORMALIZER`` with ``A_NORM``; metric ``LOCAL_STEPS``.
"""

from __future__ import annotations

from fedcore.config import Key

# ---------------------------------------------------------------- server -> client (config key)
EPOCHS = "fednova-epochs"  # int >= 1: local epochs of this client this round (drawn by the server)

# ---------------------------------------------------------------- client -> server
NORMALIZER = "fednova-normalizer"  # record
A_NORM = "a-norm"  # (1,) float64: ||a_i||_1, the client's effective number of steps (effective_steps)
LOCAL_STEPS = "local-steps"  # method metric: tau_i, the SGD steps the client took


# ---------------------------------------------------------------- the rule both sides compute
# FedNova's effective step count, computed by the client (what it sends) and the server (its bound).
#
# Local SGD with momentum rho (torch's: buf <- rho buf + g, x <- x - lr buf, buf starting at the first
# gradient) over tau steps moves x by lr * sum_j a_j g_j with a_j = (1 - rho^(tau - j + 1)) / (1 - rho), so
# ||a||_1 = sum_{k=1..tau} (1 - rho^k) / (1 - rho) (Wang et al. 2020, Sec. 4 and App.; tau when rho = 0).


def effective_steps(tau: int, momentum: float) -> float:
    """||a||_1 of tau steps of SGD with momentum ``momentum``, accumulated as the optimiser runs."""
    counter = total = 0.0
    for _ in range(tau):
        counter = momentum * counter + 1.0  # (1 - rho^k) / (1 - rho)
        total += counter
    return total


# ---------------------------------------------------------------- hyperparameters (run-config keys <method>.<key>)
HPARAMS = {
    "max-epochs": Key(0, "0 = every client runs local-epochs; else each sampled client draws its local epochs "
                      "uniformly from local-epochs..max-epochs every round (the paper: 2..5)", low=0),
}


# ---------------------------------------------------------------- its record (fedcore.registry, fedcore.tuning_grid)
SUMMARY = "FedNova (Wang et al. 2020): updates normalised by effective local steps"
STRATEGY = "fedstrategies.fednova:FedNovaStrategy"
CLIENT = "clients.fednova:FedNovaClient"
POSITION = 20  # its row in the registry's order (the README's and docs' method tables)


def example_reply(strategy, pid: int, phase: str, rng) -> dict:
    """A valid train reply for the server benchmark and the fuzz tests (random noise is no valid ||a_i||_1)."""
    import numpy as np

    from fedcore import wire
    from fedcore.methods._replies import noisy_weights

    if phase != "train":
        return {}
    weights = noisy_weights(strategy.global_weights, rng)
    a = 1.0 + (strategy.most_steps(pid) - 1.0) * rng.random()
    return {wire.WEIGHTS: wire.pack_arrays(weights), NORMALIZER: wire.pack_arrays({A_NORM: np.array([a])})}
