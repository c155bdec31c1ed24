"""FedAMP's and HeurFedAMP's message contract (see ``fedcore.contracts``).

server -> client (train):
    ``CLOUD``: the client's cloud model u_i = sum_j xi_ij w_j, the centre of its proximal term.
client -> server (train):
    ``wire.WEIGHTS``: the client's personalised model w_i after local training.
Evaluation sends nothing: each client scores its own w_i, kept in its state.
"""

# record: the cloud model u_i, arrays by state-dict key (the model's shapes and dtypes)
CLOUD = "fedamp-cloud"
# method metric (train): ||w_i - u_i||^2 after local training
DIST_TO_CLOUD = "dist-to-cloud"
