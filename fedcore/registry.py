"""The method registry, built by scanning the declarations in ``fedcore/methods/``: one entry per module there.

A method's declaration is its only record (docs/adding-a-method.md): besides its message contract, ``HPARAMS`` and
``PAPER_SETTINGS`` it names its one-line ``SUMMARY``, its server ``STRATEGY`` and its ``CLIENT`` (``"module:Class"``
strings), its ``POSITION`` in the registry's order (the order of the README's and docs' method tables), its
``TUNING_GRID`` (``fedcore.tuning_grid``) and, where the reply schema alone makes no valid reply, its
``example_reply(strategy, pid, phase, rng)`` for the server benchmark and the fuzz tests. A module's name is the
method's name with ``-`` written ``_``. Classes are imported lazily, so that the server never needs a method's
client code loaded to validate a config, and vice versa; the declarations import neither torch nor Flower.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from functools import cached_property

DECLARATIONS = "fedcore.methods"  # the package scanned
REQUIRED = ("SUMMARY", "STRATEGY", "CLIENT", "POSITION", "HPARAMS")  # what every declaration names


def _load(path: str):
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Method:
    name: str
    summary: str
    strategy_path: str  # "module:Class" of the server Strategy
    client_path: str  # "module:Class" of the ClientMethod
    declaration_path: str  # its declaration module
    position: int = 0  # its row in the registry's order

    @classmethod
    def declared_in(cls, module: str, name: str | None = None) -> Method:
        """The method a declaration module records (named after the module unless ``name`` is given)."""
        declaration = importlib.import_module(module)
        missing = [key for key in REQUIRED if not hasattr(declaration, key)]
        if missing:
            raise ValueError(f"the declaration {module} does not name {', '.join(missing)} "
                             "(docs/adding-a-method.md lists what a declaration holds)")
        name = name or module.rpartition(".")[2].replace("_", "-")
        return cls(name, declaration.SUMMARY, declaration.STRATEGY, declaration.CLIENT, module,
                   declaration.POSITION)

    @cached_property
    def strategy(self):
        return _load(self.strategy_path)

    @cached_property
    def client(self):
        return _load(self.client_path)

    @property
    def declaration(self):
        """The method's plain declaration module (contract, ``HPARAMS``, ``PAPER_SETTINGS``, its record)."""
        return importlib.import_module(self.declaration_path)

    @property
    def hparams(self) -> dict:
        """The method's hyperparameters (run-config keys ``<name>.<key>``), from its declaration."""
        return self.declaration.HPARAMS

    @property
    def tuning_grid(self) -> list[dict]:
        """The settings the tuning protocol chooses from (names without the ``<name>.`` prefix); [] when nothing
        of the method's own changes what it learns."""
        return list(getattr(self.declaration, "TUNING_GRID", []))

    @property
    def example_reply(self):
        """The declaration's ``example_reply(strategy, pid, phase, rng)``, or None where the schema suffices."""
        return getattr(self.declaration, "example_reply", None)


def scan(package: str = DECLARATIONS) -> dict[str, Method]:
    """Every declaration module of ``package``, in the order of their ``POSITION`` (ties broken by name)."""
    found = [Method.declared_in(f"{package}.{info.name}")
             for info in pkgutil.iter_modules(importlib.import_module(package).__path__)
             if not info.name.startswith("_")]
    taken: dict[int, str] = {}
    for method in found:
        if method.position in taken:
            raise ValueError(f"{method.name} and {taken[method.position]} both declare POSITION = {method.position}")
        taken[method.position] = method.name
    return {m.name: m for m in sorted(found, key=lambda m: (m.position, m.name))}


REGISTRY: dict[str, Method] = scan()


def get_method(name: str) -> Method:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; choose one of: {', '.join(REGISTRY)}") from None
