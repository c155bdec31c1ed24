"""Datasets (embedded, synthetic, downloadable) and the papers' partition schemes."""
from .datasets import DATASETS, Dataset, DatasetUnavailable, check_available, load_dataset
from .partitioners import (PARTITIONS, ClientSplit, PartitionError, build_splits, federated_data, label_counts,
                           plot_label_heatmap)

__all__ = ["Dataset", "load_dataset", "DATASETS", "DatasetUnavailable", "check_available", "PARTITIONS", "PartitionError",
           "federated_data", "ClientSplit", "build_splits", "label_counts", "plot_label_heatmap"]
