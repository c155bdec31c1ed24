"""Datasets (embedded, synthetic, downloadable) and the papers' partition schemes."""
from .datasets import DATASETS, Dataset, DatasetUnavailable, load_dataset
from .partitioners import (PARTITIONS, ClientSplit, PartitionError, build_splits, label_counts,
                           plot_label_heatmap)

__all__ = ["Dataset", "load_dataset", "DATASETS", "DatasetUnavailable", "PARTITIONS", "PartitionError",
           "ClientSplit", "build_splits", "label_counts", "plot_label_heatmap"]
