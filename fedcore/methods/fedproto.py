"""FedProto's message contract (see ``fedcore.contracts``).

server -> client (train and evaluate):
    ``wire.CLASS_FEATURES``: the global prototypes, once there are any (``HAS_PROTOTYPES``).
client -> server (train):
    ``wire.CLASS_FEATURES``: the client's class prototypes (class-mean features) with class counts.
"""

# config flag: the message carries global prototypes (false in round 1, before any aggregation)
HAS_PROTOTYPES = "has-global-prototypes"
