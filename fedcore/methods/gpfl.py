"""GPFL's message contract (see ``fedcore.contracts``).

server -> client (train and evaluate):
    ``wire.WEIGHTS``: the global feature extractor (``body.*``), the GCE's (C, d) embedding table
    (``gce.weight``) and the CoV (``cov.*``), the keys of ``fedcore.gpfl.GPFLModules``.
client -> server (train):
    ``wire.WEIGHTS``: the same tensors after local training. The head never leaves the client.
"""

from fedcore.conditional_valve import COV_PREFIX, GCE_PREFIX  # noqa: F401  (the key prefixes of the extra modules)

# ---------------------------------------------------------------- client -> server (method metrics)
GCE_LOSS = "gce-loss"  # train: mean angle-level guidance loss (cosine softmax on the GCE table)
MAGNITUDE_LOSS = "magnitude-loss"  # train: mean lambda * ||f_G - GCE_frozen[y]||_2 per batch
