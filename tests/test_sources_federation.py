"""One two-round federation per source of the user's own data, through the in-process engine (the real
ServerApp loop and ClientApp): the data card at start, every client trained and evaluated on its split."""
from __future__ import annotations

import numpy as np
import pytest

from tests.test_sources import hf_images, png_folder, table, write_csv

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def federate(inprocess, capsys, num_clients=3, **overrides):
    summary, grid = inprocess(num_clients, **{"partition": "iid", **overrides})
    card = [line for line in capsys.readouterr().out.splitlines() if line.startswith("data card: ")]
    assert len(card) == 1 and f"{num_clients} clients" in card[0]
    assert summary["rounds"] == 2 and summary["num_clients"] == num_clients and 0 <= summary["final_acc"] <= 1
    assert len(grid.contexts) == num_clients and summary["client_acc_std"] >= 0
    return summary, card[0]


def test_image_folder_with_fedsac(tmp_path, inprocess, capsys):
    _, card = federate(inprocess, capsys, method="fedsac", dataset=f"folder:{png_folder(tmp_path / 'imgs')}",
                       model="cnn")
    assert "30 samples, 3 classes, input shape (1, 8, 8)" in card


def test_npz_with_natural_clients(tmp_path, inprocess, capsys):
    x, y = table(48)
    np.savez(tmp_path / "d.npz", x=x, y=y, groups=np.repeat(np.arange(3), 16))
    federate(inprocess, capsys, method="fedrep", dataset=f"npz:{tmp_path / 'd.npz'}", partition="natural",
             model="dnn")


@pytest.mark.long
def test_csv_table_with_a_flwr_partitioner(tmp_path, inprocess, capsys):
    _, card = federate(inprocess, capsys, method="fedavg", dataset=f"csv:{write_csv(tmp_path / 't.csv', n=90)}",
                       model="mlr", partition="flwr:DirichletPartitioner",
                       **{"flwr-partitioner.args": "alpha = 1.0, self_balancing = true, min_partition_size = 10"})
    assert "90 samples, 3 classes, input shape (5,)" in card


def test_save_to_disk_folder_with_fedproto(tmp_path, inprocess, capsys):
    hf_images(36).train_test_split(test_size=0.25, seed=0).save_to_disk(str(tmp_path / "saved"))
    federate(inprocess, capsys, method="fedproto", dataset=f"hf:{tmp_path / 'saved'}", model="cnn")


def test_parquet_with_renamed_columns(tmp_path, inprocess, capsys):
    hf_images(36, label="kind", image="picture").to_parquet(str(tmp_path / "train.parquet"))
    federate(inprocess, capsys, method="fedfcd", dataset=f"hf:{tmp_path / 'train.parquet'}", model="cnn",
             **{"source.label-column": "kind", "source.x-column": "picture"})
