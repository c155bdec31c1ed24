"""pFedMe's message contract (see ``fedcore.contracts``).

server -> client:
    train (every client, every round): ``wire.WEIGHTS`` (the global model w_t) and ``UPLOAD``;
    evaluate: ``wire.WEIGHTS`` (for pFedMe(GM), and for clients that have not trained yet).
client -> server (train):
    ``wire.WEIGHTS`` (the local model w_{i,R}) when ``UPLOAD`` is true, else no record.
"""

# ---------------------------------------------------------------- server -> client (config key)
UPLOAD = "pfedme-upload"  # bool: this client is in the round's sampled set S and sends its local model
