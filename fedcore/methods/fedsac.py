"""FedSaC's message contract (see ``fedcore.contracts``).

server -> client:
    train: ``wire.WEIGHTS`` (the personalised model theta~_i, theta(0) before the client was first
    aggregated), ``REFERENCE`` (regulariser ``authors`` only, once it exists) and the ``REGULARISER``
    mode; evaluate: ``wire.WEIGHTS`` (theta~_i).
client -> server (train):
    ``wire.WEIGHTS`` (theta_i after local training) and ``SUBSPACE``.
pFedGraph (fedstrategies/pfedgraph.py) sends the same, without ``SUBSPACE``.
"""

# ---------------------------------------------------------------- server -> client
# config key: the local pull of this message, "off" or one of REGULARISERS
REGULARISER = "fedsac-regulariser"
REGULARISER_OFF = "off"  # theta~_i is still theta(0): plain cross-entropy
REGULARISERS = ("paper", "authors")  # -lambda cos(theta, theta~_i) (Eq. 9) | +lambda <c_i, theta>/|theta| (code)
# record: the authors' regulariser reference c_i = sum_j W_ij theta_j/|theta_j|, arrays by state-dict key
REFERENCE = "fedsac-reference"

# ---------------------------------------------------------------- client -> server
SUBSPACE = "fedsac-subspace"  # record: the feature subspace U_i, array BASIS
BASIS = "basis"  # (d, k) float32, orthonormal columns: top-k singular vectors of the features (Eq. 5)
# method metrics
COS_TO_RECEIVED = "cos-to-received"  # train: cos(theta_i, theta~_i) after local training
LOCAL_ACC = "local-acc"  # evaluate: accuracy of theta_i, the client's own last trained model
AGGREGATED_ACC = "aggregated-acc"  # evaluate: accuracy of the received theta~_i
