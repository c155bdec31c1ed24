"""FedMCSA's message contract (see ``fedcore.contracts``).

server -> client (train):
    ``wire.WEIGHTS``: the client's personalised model W_i, when ``RECEIVE`` says so.
client -> server (train):
    ``wire.WEIGHTS``: the client's model after training, when ``UPLOAD`` asked for it; else no record.
Clients read their mode from these flags, never from a record being absent.
"""

# config flags of a train message
RECEIVE = "fedmcsa-receive"  # the message carries this client's personalised model W_i
UPLOAD = "fedmcsa-upload"  # the reply must carry the client's model after training
