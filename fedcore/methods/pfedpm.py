"""pFedPM's message contract (see ``fedcore.contracts``). No weights cross the wire.

server -> client (train):
    ``GLOBAL_FEATURES`` once the server has global features (``HAS_GLOBAL``).
client -> server (train):
    ``wire.CLASS_FEATURES``: the local class-mean features C_i^(j) (Eq. 6) with the class counts n_ij.
"""

# ---------------------------------------------------------------- server -> client
# config flag: the train message carries GLOBAL_FEATURES (false until the first aggregation)
HAS_GLOBAL = "has-global-features"
# record: the global class features C̄^(j) (Eq. 7), arrays "class-ids" (K,) int64 and "features" (K, d) float32
GLOBAL_FEATURES = "global-features"

# ---------------------------------------------------------------- client -> server (method metrics)
RELATION_LOSS = "relation-loss"  # train: mean MSE of the relation module's steps (Eq. 12)
FEATURE_REG = "feature-reg"  # train: mean feature regulariser L_R (Eq. 11; 0 while it is off)
RELATION_ACC = "relation-acc"  # evaluate: accuracy of the relation module's prediction (R-pFedPM)
