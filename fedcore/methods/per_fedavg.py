"""Per-FedAvg's declaration (see ``fedcore.methods``): its hyperparameters; only ``fedcore.wire`` names
cross the wire."""

from __future__ import annotations

from fedcore.config import Key
from fedcore.tuning_grid import product

# ---------------------------------------------------------------- hyperparameters (run-config keys <method>.<key>)
HPARAMS = {
    "variant": Key("fo", "meta-gradient: 'fo' first-order (drops the Hessian term, as the rival papers' code runs "
                   "it) or 'hf' Hessian-free (finite-difference Hessian-vector product)", choices=("fo", "hf")),
    "alpha": Key(0.01, "alpha: step size of the inner adaptation step, in training and before evaluation "
                 "(the outer step size beta is the run's lr)", low=0.0, low_open=True),
    "delta": Key(0.001, "delta: finite-difference radius of the Hessian-free variant", low=0.0, low_open=True),
}


# ---------------------------------------------------------------- its record (fedcore.registry, fedcore.tuning_grid)
SUMMARY = "Per-FedAvg (Fallah et al. 2020): MAML meta-steps, one adaptation step before evaluation"
STRATEGY = "fedstrategies.per_fedavg:PerFedAvgStrategy"
CLIENT = "clients.per_fedavg:PerFedAvgClient"
POSITION = 17  # its row in the registry's order (the README's and docs' method tables)
TUNING_GRID = product(alpha=[0.001, 0.003, 0.01, 0.03, 0.1])
