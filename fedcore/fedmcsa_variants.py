"""FedMCSA's published variants: named sets of its options, resolved the same way by the server and the clients.

Both sides import this module (a ClientApp never imports server strategy code), so each reads the variant's
lambda, weight decay and modes from one place.
"""

from __future__ import annotations

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
    run config already holds resolved: the variant's when left at "auto" (``fedcore.paper_settings.resolve_auto``)."""
    hp = cfg.hparams()
    preset = VARIANTS[hp["variant"]]
    options = {k: preset[k] if v == AUTO else v for k, v in hp.items()}
    options["weight-decay"] = cfg["weight-decay"]
    return options
