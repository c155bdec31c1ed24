"""MuPFL's message contract (see ``fedcore.contracts``).

server -> client (train and evaluate):
    ``wire.WEIGHTS`` (the global model), ``FEATURES`` when ``HAS_FEATURES`` says so, and the round's
    learning rate under ``wire.LR``.
client -> server (train):
    ``wire.WEIGHTS`` (the trained model), ``START_HEAD`` and ``GRADIENTS`` (PKCF on), ``MAPS`` (BAVD
    on and the model has BAVD layers).
K classes, d feature width, m = ``features-per-class``.
"""

# ---------------------------------------------------------------- server -> client
HAS_FEATURES = "has-features"  # config flag: the message carries the federated features
FEATURES = "federated-features"  # record: "features" (K*m, d) float32, the federated features H, class-major

# ---------------------------------------------------------------- client -> server
START_HEAD = "start-head"  # record: the classifier local training started from (after PKCF), by state-dict key
MAPS = "bavd-maps"  # record: one float32 H x W activation map per BAVD layer, keys "0", "1", ...
# record: "z" (K, K*d + K) float32, row k the flattened (dW, db) mean CE gradient of class k at the
# received head (fedcore.class_gradients; zeros for absent classes), "present" (K,) float32 0/1
GRADIENTS = "class-gradients"
BAVD_KEEP = "bavd-keep"  # method metric (train): share of activation positions BAVD keeps
