"""The user's own model: ``model = 'package.module:factory'``.

``factory(input_shape, num_classes)`` returns either ``(body, head)``, two ``nn.Module``s where the head
maps the body's output to logits, or one ``nn.Module`` whose last ``nn.Linear`` (in module order) is
taken as the head, the rest as the body. Either becomes a ``SplitModel`` (state-dict keys ``body.*`` and
``head.*``), the split every method needs: features for FedProto, pFedPM, FedFCD, MuPFL and FedSaC's
subspaces, heads for FedRep, FedRoD, GPFL, ...

Built models are checked on a batch (``check_structure``: shapes, the head's input is the body's output,
the split computes what the module did) and, at start, on one real batch of the run's data
(``check_on_batch``: a finite loss), so a model that cannot work fails with a message before the federation.
"""
from __future__ import annotations

import importlib
import re

import torch
from torch import nn

SPEC = re.compile(r"([A-Za-z_][A-Za-z0-9_.]*):([A-Za-z_][A-Za-z0-9_]*)")  # fedcore.config.USER_MODEL, grouped


class ModelError(ValueError):
    """The user's model cannot be used as given; the message says why."""


def is_user_model(name: str) -> bool:
    return bool(SPEC.fullmatch(str(name)))


def load_factory(spec: str):
    """The callable that ``'package.module:factory'`` names; ModelError when it cannot be imported."""
    match = SPEC.fullmatch(spec)
    if not match:
        raise ModelError(f"model {spec!r}: write package.module:factory")
    module_name, attr = match.groups()
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ModelError(f"model {spec!r}: cannot import {module_name!r} ({err}); install the package or put "
                         f"the folder that holds it on PYTHONPATH") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ModelError(f"model {spec!r}: {module_name} has no callable {attr!r}")
    return factory


def _last_linear(module: nn.Module) -> tuple[str, nn.Linear]:
    found = [(n, m) for n, m in module.named_modules() if isinstance(m, nn.Linear)]
    if not found:
        raise ModelError("the model has no nn.Linear to take as its head; return (body, head) from the factory")
    return found[-1]


def _replace(module: nn.Module, dotted: str, new: nn.Module) -> None:
    parent_name, _, child = dotted.rpartition(".")
    parent = module.get_submodule(parent_name) if parent_name else module
    setattr(parent, child, new)


def _probe(input_shape: tuple[int, ...]) -> torch.Tensor:
    """A fixed batch of two inputs, drawn without touching torch's global generator."""
    return torch.randn((2, *input_shape), generator=torch.Generator().manual_seed(0))


def build_user_model(spec: str, input_shape: tuple[int, ...], num_classes: int):
    """The user's model as a ``SplitModel``; ModelError naming the problem otherwise."""
    from fedcore.models import SplitModel

    made = load_factory(spec)(tuple(input_shape), int(num_classes))
    if isinstance(made, tuple) and len(made) == 2 and all(isinstance(m, nn.Module) for m in made):
        body, head = made
        whole = None
    elif isinstance(made, nn.Module):
        name, head = _last_linear(made)
        with torch.no_grad():
            was = made.training
            made.eval()
            whole = made(_probe(input_shape))
            made.train(was)
        _replace(made, name, nn.Identity())
        body = made
    else:
        raise ModelError(f"model {spec!r}: the factory returned {type(made).__name__}; return an nn.Module or "
                         f"(body, head)")
    if not isinstance(head, nn.Linear):
        raise ModelError(f"model {spec!r}: the head is a {type(head).__name__}; it must be one nn.Linear (methods "
                         f"average, retrain and fuse it as a linear classifier): put the rest in the body")
    model = SplitModel(body, head, 0)
    model.feature_dim = check_structure(model, input_shape, num_classes, spec, whole)
    return model


def check_structure(model, input_shape, num_classes: int, spec: str, whole: torch.Tensor | None = None) -> int:
    """The body gives (B, d) features, the head (B, num_classes) logits from them; returns d. ``whole``: what
    the unsplit module gave on the probe batch, which the split must give too (its last Linear is last)."""
    x = _probe(input_shape).to(next((p.device for p in model.parameters()), torch.device("cpu")))
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            try:
                h = model.body(x)
            except Exception as err:
                raise ModelError(f"model {spec!r}: its body fails on a batch of shape {tuple(x.shape)}: "
                                 f"{err}") from None
            if h.dim() != 2:
                raise ModelError(f"model {spec!r}: the body gives features of shape {tuple(h.shape)} for a batch of "
                                 f"{len(x)}; the head's input must be the body's output, a (batch, features) matrix "
                                 f"(end the body with nn.Flatten)")
            in_features = getattr(model.head, "in_features", h.shape[1])
            if in_features != h.shape[1]:
                raise ModelError(f"model {spec!r}: the head takes {in_features} features but the body gives "
                                 f"{h.shape[1]}; the head's input must be the body's output")
            try:
                logits = model.head(h)
            except Exception as err:
                raise ModelError(f"model {spec!r}: the head fails on the body's output {tuple(h.shape)}: {err}") from None
            if tuple(logits.shape) != (len(x), num_classes):
                raise ModelError(f"model {spec!r}: it gives outputs of shape {tuple(logits.shape)} for a batch of "
                                 f"{len(x)}; expected ({len(x)}, {num_classes}), one logit per class")
            if whole is not None and (whole.shape != logits.shape or not torch.allclose(whole, logits, atol=1e-5)):
                raise ModelError(f"model {spec!r}: its last nn.Linear is not the last step of its forward (head(body(x)) "
                                 f"differs from the model's output); return (body, head) from the factory")
    finally:
        model.train(was)
    return int(h.shape[1])


def check_on_batch(model, x: torch.Tensor, y: torch.Tensor, spec: str) -> float:
    """One training-mode forward and backward on a real batch: a finite loss and finite gradients."""
    model.train()
    loss = nn.functional.cross_entropy(model(x), y)
    if not torch.isfinite(loss):
        raise ModelError(f"model {spec!r}: the loss on a batch of the run's data is {loss.item()}, not finite")
    loss.backward()
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    if bad:
        raise ModelError(f"model {spec!r}: non-finite gradients in {bad[:3]} on a batch of the run's data")
    model.zero_grad(set_to_none=True)
    return float(loss.detach())


def check_at_start(cfg, num_clients: int) -> str:
    """Build the run's user model as every client will and try it on a batch of client 0's training data;
    ConfigError naming the problem, a method that cannot use the model included. Returns a one-line summary."""
    from fedcore.config import ConfigError
    from fedcore.models import bavd_sites, seeded_model
    from partitions import federated_data

    spec = cfg["model"]
    data, splits = federated_data(*cfg.data_key(num_clients))
    try:
        model = seeded_model(spec, data.input_shape, data.num_classes, cfg["seed"])
        rows = splits[0].train[:8]
        check_on_batch(model, torch.as_tensor(data.x[rows]), torch.as_tensor(data.y[rows]), spec)
    except ModelError as err:
        raise ConfigError(str(err)) from None
    if cfg.method == "mupfl" and cfg["mupfl.bavd"] and not bavd_sites(model):
        raise ConfigError(f"model {spec!r}: mupfl.bavd = true masks conv feature maps (the model's ActivationGate "
                          f"modules, fedcore/models.py), and this model has none: add them or set mupfl.bavd = false")
    params = sum(p.numel() for p in model.parameters())
    return (f"model card: {spec}: {params:,} parameters, {model.feature_dim} features into a "
            f"{model.feature_dim}x{data.num_classes} head; checked on a batch of {len(rows)}")
