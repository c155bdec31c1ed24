"""FedGH's message contract (see ``fedcore.contracts``). No extractor weights cross the wire.

server -> client (train and evaluate):
    ``GLOBAL_HEAD``: the generalised global header theta, which replaces the client's header.
client -> server (train):
    ``wire.CLASS_FEATURES``: the client's local averaged representations (LARs: per-class mean
    features of its trained extractor over its whole training set) with the class counts.
"""

# ---------------------------------------------------------------- server -> client
# record: the global header, arrays "weight" (C, d) and "bias" (C,) float32
GLOBAL_HEAD = "global-head"
