"""The toy method's declaration (as ``fedcore/methods/<name>.py`` for a real method): its message contract and its
hyperparameters, plain values that tests/toy_method.py's strategy and client both import."""

from __future__ import annotations

from fedcore.config import Key

RECORD = "toy"  # record both ways: "probe" (3,) float32 down at round 0, "counts" (K,) label counts up
STEPS_TAG = "steps-so-far"  # method metric (train): the client's SGD steps over all rounds

HPARAMS = {"steps": Key(3, "SGD steps per round", low=1)}

# its record (fedcore.registry): what the scan of fedcore/methods/ reads (tests/test_adding_a_method.py places a copy
# of this module there)
SUMMARY = "a small method that uses every extension point of the base (tests only)"
STRATEGY = "tests.toy_method:ToyStrategy"
CLIENT = "tests.toy_method:ToyClient"
POSITION = 1000  # after every real method
