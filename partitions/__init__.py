"""Datasets (embedded, synthetic, downloadable) and the papers' partition schemes."""
from .datasets import DATASETS, Dataset, DatasetUnavailable, check_available, load_dataset
from .partitioners import (PARTITIONS, ClientSplit, PartitionError, build_splits, data_card, federated_data,
                           label_counts, plot_label_heatmap)
from .sources import SourceError, is_source

__all__ = ["Dataset", "load_dataset", "DATASETS", "DatasetUnavailable", "check_available", "PARTITIONS", "PartitionError",
           "federated_data", "ClientSplit", "build_splits", "label_counts", "plot_label_heatmap", "data_card",
           "SourceError", "is_source"]
