"""The wire format: record names, metric keys and payload packers shared by server and clients.

Every message carries a ``config`` ConfigRecord (server -> client) or a ``metrics`` MetricRecord
(client -> server). Method payloads are ArrayRecords named here, so a name is written once and both
sides import it. Payload kinds used across methods:

- ``weights``: model tensors by state-dict key (FedAvg, FedPer's body, FedSaC, FedMCSA, ...).
- ``class-features``: class-mean feature vectors ``class-ids`` (K,) int64, ``features`` (K, d) float32,
  ``counts`` (K,) int64 (FedProto, pFedPM, FedFCD).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict

# Record names
CONFIG = "config"
METRICS = "metrics"
WEIGHTS = "weights"
CLASS_FEATURES = "class-features"

# Message actions beyond Flower's train/evaluate
HANDSHAKE = "query.handshake"

# Metric / config keys
PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"
NUM_EXAMPLES = "num-examples"
SERVER_ROUND = "server-round"
TRAIN_LOSS = "train-loss"
EVAL_LOSS = "loss"
CORRECT = "correct"
NUM_TRAIN = "num-train"
NUM_TEST = "num-test"
TRAIN_LABEL_COUNTS = "train-label-counts"
TEST_LABEL_COUNTS = "test-label-counts"
INPUT_SHAPE = "input-shape"
NUM_CLASSES = "num-classes"


def pack_arrays(arrays: Mapping[str, object]) -> ArrayRecord:
    """Numpy arrays or torch tensors by name -> ArrayRecord (torch tensors are detached to CPU)."""
    out = {}
    for key, value in arrays.items():
        if hasattr(value, "detach"):
            value = value.detach().cpu().numpy()
        out[key] = Array(np.ascontiguousarray(value))
    return ArrayRecord(out)


def unpack_arrays(record: ArrayRecord) -> dict[str, np.ndarray]:
    """ArrayRecord -> ``{name: numpy array}`` in record order."""
    return {key: record[key].numpy() for key in record.keys()}


def pack_class_features(class_ids: np.ndarray, features: np.ndarray, counts: np.ndarray) -> ArrayRecord:
    """Class-mean features (one row per class present) as one record."""
    return pack_arrays(
        {
            "class-ids": np.asarray(class_ids, dtype=np.int64),
            "features": np.asarray(features, dtype=np.float32),
            "counts": np.asarray(counts, dtype=np.int64),
        }
    )


def unpack_class_features(record: ArrayRecord) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    arrays = unpack_arrays(record)
    return arrays["class-ids"], arrays["features"], arrays["counts"]


def content_bytes(content: RecordDict) -> int:
    """Serialised size of a message's content: what it costs on the wire."""
    from flwr.common.serde import recorddict_to_proto

    return recorddict_to_proto(content).ByteSize()
