"""The toy method's declaration (as ``fedcore/methods/<name>.py`` for a real method): its message contract and its
hyperparameters, plain values that tests/toy_method.py's strategy and client both import."""

from __future__ import annotations

from fedcore.config import Key

RECORD = "toy"  # record both ways: "probe" (3,) float32 down at round 0, "counts" (K,) label counts up
STEPS_TAG = "steps-so-far"  # method metric (train): the client's SGD steps over all rounds

HPARAMS = {"steps": Key(3, "SGD steps per round", low=1)}
