"""flwr-datasets' partitioners on our pools: ``partition = 'flwr:<ClassName>'``.

For users who already split their data with flwr-datasets (``DirichletPartitioner`` with
``self_balancing``, ``ShardPartitioner``, ``NaturalIdPartitioner``, ...). The partitioner gets a
Hugging Face table of the pool's ``label`` (and ``group``, where the pool has natural owners) with each
row's index, and its partitions become the clients' pools; our train/test/validation split then runs on
them as on every scheme of ours. Its arguments come from the run-config key ``flwr-partitioner.args``, a
TOML inline-table body (``"alpha = 0.3, self_balancing = true"``); ``num_partitions`` defaults to the
number of clients, ``partition_by`` to ``"label"`` (``"group"`` for the natural-id ones) and ``seed`` to
one drawn from the run's seed.
"""
from __future__ import annotations

import inspect
import tomllib

import numpy as np

PREFIX = "flwr:"


def is_flwr(partition: str) -> bool:
    return str(partition).startswith(PREFIX)


def names() -> list[str]:
    """The sample partitioners flwr-datasets has (its vertical ones split features, not samples)."""
    from flwr_datasets import partitioner

    return sorted(n for n in partitioner.__all__ if n.endswith("Partitioner") and n != "Partitioner"
                  and not n.startswith("Vertical"))


def parse_args(text: str) -> dict:
    """``"alpha = 0.3, self_balancing = true"`` -> {"alpha": 0.3, "self_balancing": True}."""
    from .partitioners import PartitionError

    try:
        return tomllib.loads(f"args = {{{text}}}")["args"]
    except tomllib.TOMLDecodeError as err:
        raise PartitionError(f"'flwr-partitioner.args' = {text!r} is not a TOML inline-table body such as "
                             f"\"alpha = 0.3, self_balancing = true\": {err}") from None


def pools(ds, partition: str, n: int, rng: np.random.Generator, args: str) -> list[np.ndarray]:
    """Each client's pool of row indices, as the named flwr-datasets partitioner deals them."""
    import datasets
    from flwr_datasets import partitioner as fp

    from .partitioners import PartitionError

    name = partition[len(PREFIX):]
    if name not in names():
        raise PartitionError(f"unknown flwr-datasets partitioner {name!r}; valid: "
                             + ", ".join(PREFIX + n for n in names()))
    cls = getattr(fp, name)
    kwargs = parse_args(args)
    params = inspect.signature(cls).parameters
    natural = "NaturalId" in name
    if natural and ds.groups is None:
        raise PartitionError(f"{partition}: dataset '{ds.name}' has no natural groups (npz 'groups', "
                             f"'source.group-column', synthetic or femnist)")
    if "num_partitions" in params:
        kwargs.setdefault("num_partitions", n)
    if "partition_by" in params:
        kwargs.setdefault("partition_by", "group" if natural else "label")
    if "seed" in params:
        kwargs.setdefault("seed", int(rng.integers(2**31 - 1)))
    try:
        dealer = cls(**kwargs)
    except (TypeError, ValueError) as err:
        raise PartitionError(f"{partition} with arguments {kwargs}: {err} (set 'flwr-partitioner.args')") from None
    table = {"label": ds.y, "index": np.arange(len(ds.y), dtype=np.int64)}
    if ds.groups is not None:
        table["group"] = ds.groups
    dealer.dataset = datasets.Dataset.from_dict(table)
    try:
        count = dealer.num_partitions
        if count != n:
            raise PartitionError(f"{partition} makes {count} partitions, the run has {n} clients; use {count} "
                                 f"clients or change 'flwr-partitioner.args'")
        return [np.sort(np.asarray(dealer.load_partition(i)["index"], np.int64)) for i in range(n)]
    except (ValueError, KeyError) as err:
        if isinstance(err, PartitionError):
            raise
        raise PartitionError(f"{partition} with arguments {kwargs} cannot split dataset '{ds.name}' "
                             f"({len(ds.y)} samples) for {n} clients: {err}") from None
