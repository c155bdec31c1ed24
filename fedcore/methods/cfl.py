"""CFL's declaration (see ``fedcore.methods``): its hyperparameters; only ``fedcore.wire`` names
cross the wire."""

from __future__ import annotations

from fedcore.config import Key
from fedcore.tuning_grid import product

LINKAGES = ("single", "complete")  # how a cluster is cut in two (fedstrategies/cfl_math.py)

# ---------------------------------------------------------------- hyperparameters (run-config keys <method>.<key>)
HPARAMS = {
    "thresholds": Key("relative", "eps1 and eps2 in units of the run's update scale R (the mean over the warm-up "
                      "rounds of the largest client update norm) or absolute (the authors' code)",
                      choices=("relative", "absolute")),
    "eps1": Key(0.15, "split a cluster only when the norm of its mean update is below eps1 (relative; the authors' "
                "code: 0.4 absolute)", low=0.0),
    "eps2": Key(0.6, "... and its largest client update norm is above eps2 (relative; the authors' code: 1.6 "
                "absolute)", low=0.0),
    "warmup-rounds": Key(20, "no split in the first this many rounds (the authors' code: 20)", low=0),
    "min-size": Key(3, "fewest updates a cluster must send this round to be split (the authors' code: 3)", low=2),
    "linkage": Key("single", "bipartition: single linkage is the paper's argmin of the largest cross-cluster "
                   "cosine; complete linkage is the authors' code", choices=LINKAGES),
    "weighting": Key("size", "p_i in the mean update and the cluster model: |D_i| / |D_c| (paper) or 1 / |c| "
                     "(authors' code)", choices=("size", "uniform")),
}


# ---------------------------------------------------------------- its record (fedcore.registry, fedcore.tuning_grid)
SUMMARY = "CFL (Sattler et al. 2020): clusters split in two by the cosine of their members' updates"
STRATEGY = "fedstrategies.cfl:CFLStrategy"
CLIENT = "clients.cfl:CFLClient"
POSITION = 26  # its row in the registry's order (the README's and docs' method tables)
TUNING_GRID = product(eps1=[0.1, 0.15, 0.25], eps2=[0.4, 0.6, 0.8])
