"""FedNova's message contract (see ``fedcore.contracts``).

server -> client:
    train: ``wire.WEIGHTS`` (the global model x) and ``EPOCHS`` (this client's local epochs this round);
    evaluate: ``wire.WEIGHTS``.
client -> server (train):
    ``wire.WEIGHTS`` (y_i after local training) and ``NORMALIZER`` with ``A_NORM``; metric ``LOCAL_STEPS``.
"""

# ---------------------------------------------------------------- server -> client (config key)
EPOCHS = "fednova-epochs"  # int >= 1: local epochs of this client this round (drawn by the server)

# ---------------------------------------------------------------- client -> server
NORMALIZER = "fednova-normalizer"  # record
A_NORM = "a-norm"  # (1,) float64: ||a_i||_1, the client's effective number of steps (fedcore.fednova)
LOCAL_STEPS = "local-steps"  # method metric: tau_i, the SGD steps the client took
