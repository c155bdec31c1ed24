"""Per-FedAvg's declaration (see ``fedcore.methods``): its hyperparameters; only ``fedcore.wire`` names
cross the wire."""

from __future__ import annotations

from fedcore.config import Key

# ---------------------------------------------------------------- hyperparameters (run-config keys <method>.<key>)
HPARAMS = {
    "variant": Key("fo", "meta-gradient: 'fo' first-order (drops the Hessian term, as the rival papers' code runs "
                   "it) or 'hf' Hessian-free (finite-difference Hessian-vector product)", choices=("fo", "hf")),
    "alpha": Key(0.01, "alpha: step size of the inner adaptation step, in training and before evaluation "
                 "(the outer step size beta is the run's lr)", low=0.0, low_open=True),
    "delta": Key(0.001, "delta: finite-difference radius of the Hessian-free variant", low=0.0, low_open=True),
}
