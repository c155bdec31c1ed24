"""FedMCSA's declaration (see ``fedcore.methods``): message contract and hyperparameters.

server -> client (train):
    ``wire.WEIGHTS``: the client's personalised model W_i, when ``RECEIVE`` says so.
client -> server (train):
    ``wire.WEIGHTS``: the client's model after training, when ``UPLOAD`` asked for it; else no record.
Clients read their mode from these flags, never from a record being absent.
"""

from __future__ import annotations

from fedcore.config import Key
from fedcore.paper_settings import same_model
from fedcore.tuning_grid import product

# config flags of a train message
RECEIVE = "fedmcsa-receive"  # the message carries this client's personalised model W_i
UPLOAD = "fedmcsa-upload"  # the reply must carry the client's model after training

# ---------------------------------------------------------------- variants (both sides resolve them the same way)
AUTO = "auto"

# fedmcsa.variant: each a named set of the options below, used for every option left at "auto" (an option given a
# value in the run config wins). Where each value comes from is in docs/papers/fedmcsa.md.
VARIANTS: dict[str, dict[str, object]] = {
    # the paper's text: Alg. 1 (every client trains), lambda = 5 on a fixed centre, a layer as the unit (Sec. 3.2),
    # plain attention; the paper states no weight decay
    "paper": {"lambda": 5.0, "train": "all", "component": "layer", "size-weighting": False, "weight-decay": 0.0},
    # the authors' published code: every client trains, the prox centre aliased to the trained weights (lambda has
    # no effect, i.e. lambda = 0), every tensor its own component, attention reweighted by n_k, +0.001 Theta in
    # every gradient
    "authors-code": {"lambda": 0.0, "train": "all", "component": "tensor", "size-weighting": True,
                     "weight-decay": 0.001},
    # our implementation spec: the paper's maths with its Option B (only the S sampled clients train)
    "spec": {"lambda": 5.0, "train": "sampled", "component": "layer", "size-weighting": False, "weight-decay": 0.0},
}
DEFAULT_VARIANT = "authors-code"  # reproduces the paper's Synthetic result best, on validation (docs/papers/fedmcsa.md)


def resolve_options(cfg) -> dict:
    """The method's options with every "auto" one taken from ``fedmcsa.variant``, plus ``weight-decay``, which the
    run config already holds resolved: the variant's when left at "auto" (``setting_options`` below)."""
    hp = cfg.hparams()
    preset = VARIANTS[hp["variant"]]
    options = {k: preset[k] if v == AUTO else v for k, v in hp.items()}
    options["weight-decay"] = cfg["weight-decay"]
    return options


_FROM_VARIANT = "; auto = the value of fedmcsa.variant"

# ---------------------------------------------------------------- hyperparameters (run-config keys <method>.<key>)
HPARAMS = {
    "variant": Key(DEFAULT_VARIANT, "named set of the options lambda, train, component, size-weighting and the "
                   "weight decay, used for each of them left at auto", choices=tuple(VARIANTS)),
    "sigma": Key(50.0, "scale sigma of the cosine similarity in the attention softmax", low=0.0),
    "lambda": Key(AUTO, "proximal weight lambda of the local objective f_i + lambda/2 ||w - W_i||^2 (0: FedAvg+MCSA)"
                  + _FROM_VARIANT, kind="float", low=0.0),
    "clients-per-round": Key(20, "S: clients whose models are mixed and personalised each round (at most N)", low=1),
    "train": Key(AUTO, "who trains each round: every client (Alg. 1) or only the S sampled ones" + _FROM_VARIANT,
                 choices=(AUTO, "all", "sampled")),
    "component": Key(AUTO, "attention unit: a layer (weight and bias together, the paper) or a tensor (the code)"
                     + _FROM_VARIANT, choices=(AUTO, "layer", "tensor")),
    "aggregation": Key("attention", "attention (FedMCSA) or the n-weighted mean (ablation FedMCSA without MCSA)",
                       choices=("attention", "mean")),
    "size-weighting": Key(AUTO, "reweight the attention by the clients' training-set sizes (the authors' code)"
                          + _FROM_VARIANT, kind="bool"),
    "attention-round": Key(0, "round whose attention matrices are saved (round_matrices/); 0 = the last round",
                           low=0),
}


# ---------------------------------------------------------------- paper settings (fedcore.paper_settings)
# Table of hyperparameters: eta 0.02, batch 20, R = 20 local steps, no momentum, MLR on Synthetic. fraction-train
# stays 1.0: FedMCSA samples its S clients itself (fedmcsa.clients-per-round) and every client trains each round
# (Alg. 1); the weight decay is the variant's (``setting_options``)
PAPER_SETTINGS = {
    "*": {"lr": 0.02, "momentum": 0.0, "batch-size": 20, "local-steps": 20, "fraction-train": 1.0,
          "weight-decay": VARIANTS[DEFAULT_VARIANT]["weight-decay"]},
    **same_model("mlr", "synthetic", "mnist5k", "mnist", "fmnist", "cifar10"),
}


def setting_options(hparams: dict) -> dict:
    """The paper-setting values that this run's ``fedmcsa.*`` options decide: the variant's weight decay."""
    return {"weight-decay": VARIANTS[hparams.get("variant", DEFAULT_VARIANT)]["weight-decay"]}


# ---------------------------------------------------------------- its record (fedcore.registry, fedcore.tuning_grid)
SUMMARY = "FedMCSA (Guo et al. 2023): per-layer self-attention across clients' models on the server"
STRATEGY = "fedstrategies.fedmcsa:FedMCSAStrategy"
CLIENT = "clients.fedmcsa:FedMCSAClient"
POSITION = 9  # its row in the registry's order (the README's and docs' method tables)
TUNING_GRID = product(variant=["authors-code", "paper"], sigma=[10.0, 50.0, 100.0])
