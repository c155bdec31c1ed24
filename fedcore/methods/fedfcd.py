"""FedFCD's message contract (see ``fedcore.contracts``). No weights cross the wire.

server -> client:
    prepare (round 0): nothing; train: ``GLOBAL_HEAD`` and ``wire.CLASS_FEATURES`` (the GFRs:
    class ids, (K, d) global features, counts; with ``gfr-download = "own"`` only the client's
    classes); evaluate: ``GLOBAL_HEAD`` only.
client -> server (prepare and train):
    ``wire.CLASS_FEATURES``: the client's LFRs (per-class mean features of its extractor, Eq. 3)
    with the class counts.
"""

# ---------------------------------------------------------------- server -> client
# record: the global head phi_g, arrays "weight" (C, d) and "bias" (C,) float32
GLOBAL_HEAD = "global-head"

# ---------------------------------------------------------------- client -> server (method metrics)
HEAD_LOSS = "head-loss"  # train: stage B's loss (personal head), alternation "epoch" only
ALIGNMENT_LOSS = "alignment-loss"  # train: mean feature-alignment term R_i (Eq. 6), when it is on
