"""Server time and memory of every strategy at 10, 100 and 1,000 clients, with real-shaped replies.

For each (method, number of clients) a fresh process builds the strategy for the CNN on 28x28
input (10 classes, 2 classes per client), makes one round of replies with the shapes the strategy
asks for (``reply_schema``; a method with exotic payloads declares an ``example_reply``), and then
times what the server itself does in a round: ``configure_train`` + ``aggregate_train`` (validation
included) + ``configure_evaluate`` + ``aggregate_evaluate`` (and round 0 for methods that have one).
Building the replies (the network's job) is outside the timed part. Memory is the growth of the
process's peak RSS during the timed part, so the replies themselves are not counted.

``--round R`` times round R instead, after R - 1 untimed rounds with the same kind of replies: a
server that keeps every client's model (FedAMP) starts with one shared initial model, so its round 1
is cheaper than the rounds after it. Such rows are labelled "method (round R)". ``--merge`` keeps the
rows of the existing ``table.csv`` that this run did not measure (each row keeps the command and
commit it was made by, and ``table.md`` names them), so a few methods can be re-measured alone.

    python -m benchmarks.server_time [--clients 10,100,1000] [--methods fedavg,fedproto] [--round 1] [--merge]
        [--device cpu|cuda] [--out docs/results/server-time]

``--device`` is the run config's ``server-device`` for the timed rounds (default cpu, the numbers the table
has always had); every row records the device (and the GPU's name). Each client count also gets a
"matrix-product floor" row: one m x d by d x m product at the same sizes on the same device, in the same run, and a
"data movement floor" row: decoding every reply and encoding every personalised reply, nothing else
(``movement_floor``); under the table, each method's round against it.

Writes ``table.md``, ``table.csv`` and ``server_time.png`` in the output folder. Where a method's round has
computations no implementation of its rule can avoid, they are timed alone on the same round's data and get rows
of their own, "method (what alone)", with the round's ratio to them under the table (``UNAVOIDABLE``): MuPFL's
pairwise cosine matrices, and those plus PKCF's gradient matching; FedAMP's, HeurFedAMP's, FedSaC's and pFedGraph's
two m x m x d matrix products (the pairwise Gram matrix of the round's models and the mixing W @ Theta); FedAvg's
weighted sum of the round's models, and that of every method whose server rule is a weighted mean of the replies'
models (FedAvg-FT, FedProx, FedPer, FedRep, Ditto, Per-FedAvg, L2GD, FedNova, FedRoD, GPFL); CReFF's, and that plus
its gradient matching and classifier re-training; FedGH's training of the global header on the round's pairs;
CFL's weighted mean and update norms (its split criterion); FeSEM's distances to the K centres and the centres' means.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from tests.fakes import fake_clients, fake_reply

TARGET_S = 0.5


def _config(method: str, extra: dict):
    from fedcore.config import Config

    # MuPFL's BAVD needs a model with BAVD sites: its paper's CNN (a ConfigError on "cnn")
    model = "mupflcnn" if method == "mupfl" else "cnn"
    return Config.from_run_config({"method": method, "dataset": "mnist5k", "model": model, **extra})


def _untimed_round(strategy, server_round: int, rng) -> None:
    """A whole round (train and evaluate) with the benchmark's replies, before the timed one."""
    from flwr.app import ArrayRecord, ConfigRecord

    msgs = list(strategy.configure_train(server_round, ArrayRecord(), ConfigRecord(), None))
    strategy.aggregate_train(server_round, [fake_reply(strategy, m, "train", rng) for m in msgs])
    msgs = list(strategy.configure_evaluate(server_round, ArrayRecord(), ConfigRecord(), None))
    strategy.aggregate_evaluate(server_round, [fake_reply(strategy, m, "evaluate", rng) for m in msgs])


def measure(method: str, n: int, extra: dict, server_round: int = 1) -> dict:
    """One (method, clients) case in this process: seconds per phase of round ``server_round`` (the
    rounds before it untimed) and peak-memory growth."""
    from flwr.app import ArrayRecord, ConfigRecord
    from flwr.supercore.task_identity import TaskIdentity

    from fedcore.models import model_facts
    from fedcore.registry import get_method

    from fedstrategies import server_device

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    cfg = _config(method, extra)
    server_device.start(cfg["server-device"])  # as the ServerApp does at a run's start
    facts = model_facts(cfg["model"], (1, 28, 28), 10, 0)  # "cnn" unless --run-config names another
    strategy = get_method(method).strategy(cfg, fake_clients(n), facts)
    rng = np.random.default_rng(0)
    arrays, config = ArrayRecord(), ConfigRecord()
    times = {"prepare": 0.0, "configure": 0.0, "aggregate": 0.0, "evaluate": 0.0}
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    msgs = strategy.configure_prepare(None)
    times["prepare"] += time.perf_counter() - t
    if msgs:
        replies = [fake_reply(strategy, m, "prepare", rng) for m in msgs]
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t = time.perf_counter()
        strategy.aggregate_prepare_replies(replies)
        times["prepare"] += time.perf_counter() - t
        del replies
    for earlier in range(1, server_round):
        _untimed_round(strategy, earlier, rng)
    if server_round > 1:  # the peak so far is the untimed rounds': start the peak again from the current RSS (Linux)
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            pass
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cpu = 0.0  # process CPU seconds of the round (on a loaded machine wall time says little)
    t, c = time.perf_counter(), time.process_time()
    msgs = list(strategy.configure_train(server_round, arrays, config, None))
    times["configure"], cpu = time.perf_counter() - t, cpu + time.process_time() - c
    replies = [fake_reply(strategy, m, "train", rng) for m in msgs]
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t, c = time.perf_counter(), time.process_time()
    strategy.aggregate_train(server_round, replies)
    times["aggregate"], cpu = time.perf_counter() - t, cpu + time.process_time() - c
    kept = replies if method in UNAVOIDABLE else None  # for the unavoidable computations alone, timed last
    del replies, msgs
    t, c = time.perf_counter(), time.process_time()
    msgs = list(strategy.configure_evaluate(server_round, arrays, config, None))
    times["evaluate"], cpu = time.perf_counter() - t, cpu + time.process_time() - c
    replies = [fake_reply(strategy, m, "evaluate", rng) for m in msgs]
    t, c = time.perf_counter(), time.process_time()
    strategy.aggregate_evaluate(server_round, replies)
    times["evaluate"], cpu = times["evaluate"] + time.perf_counter() - t, cpu + time.process_time() - c
    rss2 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if strategy.dropped:
        raise SystemExit(f"{method}: the benchmark's replies were dropped: {strategy.dropped[:2]}")
    alone = UNAVOIDABLE[method](strategy, kept, server_round) if kept else []
    return {"alone": alone, "method": method, "clients": n, "round": server_round, **{f"{k}_s": v for k, v in times.items()},
            "round_s": times["configure"] + times["aggregate"] + times["evaluate"], "round_cpu_s": cpu,
            "peak_growth_mb": max(rss2 - max(rss0, rss1), 0) / 1024,
            "sampled": len(strategy.sample_train(server_round)), "device": server_device.describe()}


def mupfl_cosine_alone(strategy, messages, repeats: int = 5) -> dict:
    """What a MuPFL round cannot avoid, timed alone on the round's train replies: the pairwise cosine matrices
    of the clients' updates dw_i = w_i - w_i^start (every trainable tensor; the start head where the client
    sent one that differs from the global one, as the strategy reads it) and of their activation maps. The
    float32 matrices are stacked and put on the server device before the clock starts; the time (median of
    ``repeats``) is the two Gram products and their normalisation. ``cosine_mb``: the size of the two
    stacked matrices."""
    from fedcore import wire
    from fedcore.methods.mupfl import MAPS, START_HEAD

    records = [msg.content for msg in messages]
    keys = strategy.param_keys
    width = sum(strategy.global_weights[k].size for k in keys)
    updates = np.empty((len(records), width), np.float32)
    maps = None
    for i, content in enumerate(records):
        weights = wire.unpack_arrays(content[wire.WEIGHTS])
        heads = wire.unpack_arrays(content[START_HEAD]) if START_HEAD in content else {}
        updates[i] = np.concatenate([(weights[k] - heads.get(k, strategy.global_weights[k])).reshape(-1) for k in keys])
        if MAPS in content:
            row = np.concatenate([v.reshape(-1) for v in wire.unpack_arrays(content[MAPS]).values()])
            maps = np.empty((len(records), row.size), np.float32) if maps is None else maps
            maps[i] = row

    from fedstrategies import server_device

    def cosines(x):
        gram = x @ x.T
        inv = 1.0 / gram.diagonal().sqrt()
        return _synced(gram * inv[:, None] * inv[None, :])

    on_device = [server_device.put(x) for x in (updates, maps) if x is not None]  # the round's device, before the clock
    wall, cpu = _timed(lambda: [cosines(x) for x in on_device], repeats)
    return {"cosine_s": wall, "cosine_cpu_s": cpu,
            "cosine_mb": (updates.nbytes + (maps.nbytes if maps is not None else 0)) / 2**20}


def _synced(*tensors):
    """Wait for the device to finish ``tensors`` (CUDA runs asynchronously): the clock then times the work."""
    import torch

    if any(t.is_cuda for t in tensors):
        torch.cuda.synchronize()
    return tensors


def _timed(fn, repeats: int) -> tuple[float, float]:
    """Median wall and CPU seconds of ``fn()`` over ``repeats`` calls."""
    walls, cpus = [], []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    return float(np.median(walls)), float(np.median(cpus))


def mupfl_matching_alone(strategy, messages, repeats: int = 3) -> dict:
    """PKCF's gradient matching on the server (the strategy's own ``matched_features``: ``match-steps`` steps on
    the K*m x d federated features against the round's averaged class gradients), which the paper's method runs
    every round whatever the number of clients, timed alone (median of ``repeats``; it changes no state)."""
    from fedcore import wire
    from fedcore.methods.mupfl import GRADIENTS

    gradients = [(g["z"], g["present"]) for g in (wire.unpack_arrays(msg.content[GRADIENTS]) for msg in messages)]
    head = {k: strategy.global_weights[k] for k in strategy.head_keys}
    wall, cpu = _timed(lambda: strategy.matched_features(gradients, head), repeats)
    return {"s": wall, "cpu_s": cpu, "mb": strategy.features.nbytes / 2**20}


def mupfl_unavoidable(strategy, messages, server_round: int) -> list[dict]:
    """MuPFL: its cosine matrices alone, and those plus PKCF's matching (both parts of the paper's rule)."""
    cos = mupfl_cosine_alone(strategy, messages)
    rows = [{"what": "cosine matrix", "s": cos["cosine_s"], "cpu_s": cos["cosine_cpu_s"], "mb": cos["cosine_mb"]}]
    if strategy.hp["pkcf"]:
        match = mupfl_matching_alone(strategy, messages)
        rows.append({"what": "cosine matrix + PKCF matching", "s": cos["cosine_s"] + match["s"],
                     "cpu_s": cos["cosine_cpu_s"] + match["cpu_s"], "mb": cos["cosine_mb"] + match["mb"]})
    return rows


def fedamp_products_alone(strategy, messages, server_round: int, repeats: int = 3) -> list[dict]:
    """FedAMP / HeurFedAMP: the two float32 products any exact message passing over m models of d parameters
    makes, the Gram matrix Theta Theta^T (pairwise distances or cosines) and the mixing W @ Theta, on the models
    the server holds for the round's clients, stacked and put on the server device before the clock starts
    (median of ``repeats``)."""
    return _gram_and_mixing_alone([strategy.model_of(pid) for pid in strategy.sample_train(server_round)], repeats)


def replies_products_alone(strategy, messages, server_round: int, repeats: int = 3) -> list[dict]:
    """FedSaC / pFedGraph: the same two products (the Gram matrix of the round's models and the mixing W @ Theta)
    over the models of the round's train replies, stacked before the clock starts."""
    return _gram_and_mixing_alone(_reply_models(messages), repeats)


def _reply_models(messages) -> list[dict]:
    """The models of the round's train replies, as the server reads them (read-only views of the replies' bytes)."""
    from fedcore import wire

    return [wire.unpack_arrays(msg.content[wire.WEIGHTS]) for msg in messages]


def _stacked(states) -> np.ndarray:
    """The float32 parameters of ``states`` stacked, one row per model."""
    from fedstrategies.pairwise import parameter_keys

    keys = parameter_keys(states[0])
    return np.stack([np.concatenate([np.asarray(s[k], np.float32).reshape(-1) for k in keys]) for s in states])


def _gram_and_mixing_alone(states, repeats: int) -> list[dict]:
    """Theta Theta^T and W @ Theta (full float32 products) over the stacked ``states`` on the server device."""
    from fedstrategies import server_device

    theta = _stacked(states)
    mixing = np.full((len(states), len(states)), 1.0 / len(states), np.float32)
    on_device, mixing = server_device.put(theta), server_device.put(mixing)  # the round's device, before the clock
    wall, cpu = _timed(lambda: _synced(on_device @ on_device.T, mixing @ on_device), repeats)
    return [{"what": "Gram + mixing products", "s": wall, "cpu_s": cpu, "mb": theta.nbytes / 2**20}]


def weighted_sum_alone(strategy, messages, server_round: int, repeats: int = 3) -> list[dict]:
    """FedAvg and every method whose server rule is a weighted mean of the replies' models: the one product that
    rule makes, the weighted sum of the round's m models (a 1 x m by m x d float32 product over the replies' models,
    stacked before the clock starts)."""
    from fedstrategies import server_device

    theta = _stacked(_reply_models(messages))
    weights = server_device.put(np.full((1, len(theta)), 1.0 / len(theta), np.float32))
    on_device = server_device.put(theta)
    wall, cpu = _timed(lambda: _synced(weights @ on_device), repeats)
    return [{"what": "weighted sum", "s": wall, "cpu_s": cpu, "mb": theta.nbytes / 2**20}]


def cfl_unavoidable(strategy, messages, server_round: int, repeats: int = 3) -> list[dict]:
    """CFL: what its split criterion reads every round, on the one cluster's m models stacked before the clock
    starts: the weighted mean w @ Theta and every update norm ||Theta_i - theta||^2 = ||Theta_i||^2 - 2 Theta_i theta +
    ||theta||^2 (the row norms of Theta and Theta theta), three passes over the models."""
    import torch

    from fedstrategies import server_device

    theta = server_device.put(_stacked(_reply_models(messages)))
    weights = server_device.put(np.full((1, theta.shape[0]), 1.0 / theta.shape[0], np.float32))
    reference = theta[0].clone()  # the cluster's model: any d-vector costs the same

    def criterion():
        return _synced(weights @ theta, torch.linalg.vector_norm(theta, dim=1), theta @ reference)

    wall, cpu = _timed(criterion, repeats)
    return [{"what": "weighted sum + update norms", "s": wall, "cpu_s": cpu, "mb": theta.numel() * 4 / 2**20}]


def fesem_unavoidable(strategy, messages, server_round: int, repeats: int = 3) -> list[dict]:
    """FeSEM: one E- and M-step on the round's m models stacked before the clock starts: the distances to the K
    centres, ||Theta_i||^2 - 2 Theta C^T + ||C_k||^2 (the row norms of Theta and an m x d by d x K product), and the
    K centres' means R @ Theta (R: the one-hot weights)."""
    import torch

    from fedstrategies import server_device

    theta = server_device.put(_stacked(_reply_models(messages)))
    k = strategy.k
    centres = theta[:k].clone()
    onehot = np.zeros((k, theta.shape[0]), np.float32)
    onehot[np.arange(theta.shape[0]) % k, np.arange(theta.shape[0])] = 1.0
    onehot = server_device.put(onehot / onehot.sum(axis=1, keepdims=True))

    def em_step():
        return _synced(torch.linalg.vector_norm(theta, dim=1), theta @ centres.T, onehot @ theta)

    wall, cpu = _timed(em_step, repeats)
    return [{"what": "distances + centre means", "s": wall, "cpu_s": cpu, "mb": theta.numel() * 4 / 2**20}]


def product_floor(n: int, extra: dict, repeats: int = 5) -> dict:
    """The matrix-product floor at n clients on the server device: one m x d by d x m float32 product (m = n, d =
    the parameters of the benchmark's CNN), the operands already on the device, median of ``repeats`` (CUDA:
    synchronised before the clock stops). Every dense rule over m models of d parameters makes at least one."""
    import torch

    from fedcore.models import model_facts
    from fedstrategies import server_device
    from fedstrategies.pairwise import parameter_keys

    device = server_device.start(extra.get("server-device", "cpu"))
    weights = model_facts("cnn", (1, 28, 28), 10, 0).initial_weights
    d = sum(int(np.asarray(weights[k]).size) for k in parameter_keys(weights))
    theta = torch.randn(n, d, generator=torch.Generator().manual_seed(0)).to(device)

    def product():
        _synced(theta @ theta.T)

    product()  # warm-up (CUDA: the kernel's first call)
    wall, cpu = _timed(product, repeats)
    return {"method": "matrix-product floor", "clients": n, "round": 1, "sampled": n, "round_s": wall,
            "round_cpu_s": cpu, "configure_s": 0.0, "aggregate_s": wall, "evaluate_s": 0.0, "prepare_s": 0.0,
            "peak_growth_mb": theta.element_size() * theta.numel() / 2**20, "device": server_device.describe(device),
            "d": d}


MOVEMENT_FLOOR = "data movement floor"


def movement_floor(n: int, repeats: int = 3) -> dict:
    """The data-movement floor at n clients: what any personalised round moves, and nothing else. Decode every one
    of n train replies (the benchmark's CNN, packed as clients send it: ``wire.unpack_arrays``, read-only views of
    the reply's bytes) and encode one personalised reply per client from it (``wire.pack_arrays``, the one copy of
    the model a message needs); each encoded record is dropped at once, so the MB column is the replies' size.
    Median of ``repeats``; host memory, whatever the server device (its transfers are the GPU's own rows)."""
    from fedcore import wire
    from fedcore.models import model_facts
    from fedcore.methods._replies import noisy_weights

    weights = model_facts("cnn", (1, 28, 28), 10, 0).initial_weights
    rng = np.random.default_rng(0)
    replies = [wire.pack_arrays(noisy_weights(weights, rng)) for _ in range(n)]
    parts = {"decode": 0.0, "encode": 0.0}

    def move():
        decoded = [wire.unpack_arrays(record) for record in replies]
        t = time.perf_counter()
        for arrays in decoded:
            wire.pack_arrays(arrays)
        parts["encode"] = time.perf_counter() - t

    move()  # warm-up (the layout cache)
    wall, cpu = _timed(move, repeats)
    size = sum(len(record[wire.PACKED_KEY].data) for record in replies)
    return {"method": MOVEMENT_FLOOR, "clients": n, "round": 1, "sampled": n, "round_s": wall, "round_cpu_s": cpu,
            "configure_s": parts["encode"], "aggregate_s": max(wall - parts["encode"], 0.0), "evaluate_s": 0.0,
            "prepare_s": 0.0, "peak_growth_mb": size / 2**20, "device": "cpu (host memory)"}


def creff_unavoidable(strategy, messages, server_round: int, repeats: int = 3) -> list[dict]:
    """CReFF: FedAvg's weighted sum, and that plus what its server runs every round whatever the number of
    clients: ``match-steps`` steps of gradient matching on the K*m x d federated features (at the round's averaged
    class gradients, averaged before the clock starts) and the classifier's re-training on them (``retrain-epochs``
    epochs of mini-batches). Both run on copies with their own generator (median of ``repeats``): no state changes."""
    import torch

    from fedcore import wire
    from fedcore.class_gradients import synthetic_labels
    from fedcore.methods.creff import GRADIENTS
    from fedcore.models import one_torch_thread
    from fedstrategies.creff import BIAS, WEIGHT
    from fedstrategies.federated_features import (average_class_gradients, fresh_linear, match_features,
                                                  retrain_classifier)

    (summed,) = weighted_sum_alone(strategy, messages, server_round)
    hp, K, d = strategy.hp, strategy.num_classes, strategy.model.feature_dim
    z, reported = average_class_gradients((g["z"], g["present"]) for g in
                                          (wire.unpack_arrays(msg.content[GRADIENTS]) for msg in messages))
    target, reported = torch.from_numpy(z.astype(np.float32)), torch.from_numpy(reported)
    labels = synthetic_labels(K, hp["features-per-class"])
    weight, bias = (torch.from_numpy(strategy.retrained[k]) for k in (WEIGHT, BIAS))

    def match_and_retrain():
        with one_torch_thread():
            features = torch.from_numpy(strategy.features.copy())
            match_features(features, target, reported, weight, bias, hp["match-steps"], hp["match-lr"],
                           hp["match-optimizer"])
            generator = torch.Generator().manual_seed(0)
            retrain_classifier(features, labels, *fresh_linear(d, K, generator), hp["retrain-epochs"],
                               hp["retrain-lr"], hp["retrain-batch"], generator)

    wall, cpu = _timed(match_and_retrain, repeats)
    return [summed, {"what": "weighted sum + matching + re-training", "s": summed["s"] + wall,
                     "cpu_s": summed["cpu_s"] + cpu, "mb": summed["mb"] + strategy.features.nbytes / 2**20}]


def fedgh_training_alone(strategy, messages, server_round: int, repeats: int = 3) -> list[dict]:
    """FedGH: its rule is the server's SGD on the global header over the round's (LAR, class) pairs (one pair per
    client and class held), timed alone on a copy of the header with its own generator (median of ``repeats``;
    the pairs are gathered before the clock starts): the work grows with the pairs, so with the clients."""
    import copy

    import torch

    from fedcore import wire
    from fedstrategies.fedfcd_math import feature_pairs

    x, y = feature_pairs([wire.unpack_arrays(msg.content[wire.CLASS_FEATURES]) for msg in messages])

    def train():
        hp = strategy.hp
        copy.deepcopy(strategy.head).train(x, y, batch_size=hp["server-batch-size"], epochs=hp["server-epochs"],
                                           generator=torch.Generator().manual_seed(0))

    wall, cpu = _timed(train, repeats)
    return [{"what": "header training", "s": wall, "cpu_s": cpu, "mb": (x.numel() * x.element_size()) / 2**20}]


UNAVOIDABLE = {"mupfl": mupfl_unavoidable, "fedamp": fedamp_products_alone, "heurfedamp": fedamp_products_alone,
               "fedsac": replies_products_alone, "pfedgraph": replies_products_alone, "creff": creff_unavoidable,
               "fedgh": fedgh_training_alone, "cfl": cfl_unavoidable, "fesem": fesem_unavoidable,
               # the server rule is a weighted mean of the replies' models (FedAvg's aggregate, or FedNova's weights)
               **dict.fromkeys(("fedavg", "fedavg-ft", "fedprox", "fedper", "fedrep", "ditto", "per-fedavg", "l2gd",
                                "fednova", "fedrod", "gpfl"), weighted_sum_alone)}
ALONE = re.compile(r"^(?P<method>\S+) \((?P<what>.+) alone\)$")


def _alone_notes(rows: list[dict], counts: list[int]) -> list[str]:
    """Under the table: each method's round against each of its unavoidable computations alone, at the most
    clients (a row "method (what alone)" beside the method's row of the same round)."""
    n = counts[-1]
    by = {(r["method"], r.get("round", 1)): r for r in rows if r["clients"] == n}
    notes = []
    for (label, rnd), alone in by.items():
        match = ALONE.match(label)
        parent = by.get((match["method"], rnd)) if match else None
        if parent and alone["round_s"] > 0:
            notes.append(f"{_label(parent)} at {n} clients: round / {match['what']} alone = "
                         f"{parent['round_s'] / alone['round_s']:.1f} (wall), "
                         f"{parent['round_cpu_s'] / max(alone['round_cpu_s'], 1e-9):.1f} (CPU).")
    if notes:
        notes = ["", "X alone: a computation no implementation of the method's rule can avoid, timed alone by the "
                 "benchmark on the same round's data (median of 3-5 calls; MuPFL's cosine matrix: the Gram "
                 "products of the stacked float32 updates and activation maps of the round's sampled clients and "
                 "their normalisation; PKCF matching: match-steps steps on the federated features; Gram + mixing "
                 "products (FedAMP, HeurFedAMP, FedSaC, pFedGraph): Theta Theta^T and W @ Theta over the round's "
                 "models; weighted sum (FedAvg, CReFF and every method whose server rule is a weighted mean of the "
                 "replies' models): w @ Theta; CReFF's matching + re-training: match-steps "
                 "steps on the federated features, then retrain-epochs epochs of its classifier on them; FedGH's "
                 "header training: server-epochs of SGD on the round's (LAR, class) pairs; CFL's weighted sum + update "
                 "norms: w @ Theta, the row norms of Theta and Theta theta; FeSEM's distances + centre means: the row "
                 "norms of Theta, Theta C^T and R @ Theta over K centres); its MB "
                 "column is the size of the "
                 "stacked matrices.", *notes]
    return notes


def _movement_notes(rows: list[dict], counts: list[int]) -> list[str]:
    """Under the table: each method's round at the most clients against the data-movement floor there, plus its
    unavoidable computations alone where the table has them (the issue's bar: within 2x)."""
    n = counts[-1]
    by = {(r["method"], r.get("round", 1)): r for r in rows if r["clients"] == n}
    floor = by.get((MOVEMENT_FLOOR, 1))
    if floor is None or floor["round_s"] <= 0:
        return []
    notes = ["", f"{MOVEMENT_FLOOR}: decode every one of the clients' train replies (the CNN, packed as sent: "
             "read-only views) and encode one personalised reply per client (one copy of the model each), nothing "
             f"else; host memory, median of 3. At {n} clients, each round / (its computations alone + that floor):"]
    for (label, rnd), row in by.items():
        if label in (MOVEMENT_FLOOR, "matrix-product floor") or ALONE.match(label):
            continue
        alone = [r for (lab, r_rnd), r in by.items()
                 if r_rnd == rnd and (m := ALONE.match(lab)) and m["method"] == label]
        wall = max((r["round_s"] for r in alone), default=0.0)
        cpu = max((r["round_cpu_s"] for r in alone), default=0.0)
        what = " (with its computations alone)" if alone else ""
        notes.append(f"- {_label(row)}: {row['round_s'] / (wall + floor['round_s']):.1f}x (wall), "
                     f"{row['round_cpu_s'] / max(cpu + floor['round_cpu_s'], 1e-9):.1f}x (CPU){what}")
    return notes


def run(methods: list[str], clients: list[int], out: Path, extra: dict, server_round: int = 1,
        made: dict | None = None, merge: bool = False) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in clients:
        for method in methods:
            cmd = [sys.executable, "-m", "benchmarks.server_time", "--one", method, str(n), json.dumps(extra),
                   "--round", str(server_round)]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"{method} at {n} clients failed:\n{done.stderr[-3000:]}")
            row = {**json.loads(done.stdout.strip().splitlines()[-1]), **(made or {})}
            alone = row.pop("alone", [])
            rows.append(row)
            for part in alone:  # the unavoidable computations, each a row of its own
                rows.append({**row, "method": f"{method} ({part['what']} alone)", "round_s": part["s"],
                             "round_cpu_s": part["cpu_s"], "configure_s": 0.0, "aggregate_s": part["s"],
                             "evaluate_s": 0.0, "prepare_s": 0.0, "peak_growth_mb": part["mb"]})
            print(f"{method:>10} {n:>5} clients: round {row['round_s']:.3f} s (configure {row['configure_s']:.3f}, "
                  f"aggregate {row['aggregate_s']:.3f}, evaluate {row['evaluate_s']:.3f}, prepare "
                  f"{row['prepare_s']:.3f}; CPU {row['round_cpu_s']:.3f} s), peak +{row['peak_growth_mb']:.0f} MB",
                  flush=True)
        cmd = [sys.executable, "-m", "benchmarks.server_time", "--floor", str(n), json.dumps(extra)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"the matrix-product floor at {n} clients failed:\n{done.stderr[-3000:]}")
        floor = {**json.loads(done.stdout.strip().splitlines()[-1]), **(made or {})}
        rows.append(floor)
        print(f"matrix-product floor {n:>5} x {floor['d']} on {floor['device']}: {floor['round_s']:.4f} s", flush=True)
        done = subprocess.run([sys.executable, "-m", "benchmarks.server_time", "--movement", str(n)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"the data movement floor at {n} clients failed:\n{done.stderr[-3000:]}")
        moved = {**json.loads(done.stdout.strip().splitlines()[-1]), **(made or {})}
        rows.append(moved)
        print(f"data movement floor {n:>5} replies: {moved['round_s']:.4f} s (encode {moved['configure_s']:.4f} s)",
              flush=True)
    if merge and (out / "table.csv").exists():
        measured = {(r["method"], r["clients"], r["round"]) for r in rows}
        rows = [r for r in read_rows(out / "table.csv") if (r["method"], r["clients"], r["round"]) not in measured] + rows
    write(rows, out)
    return rows


FIELDS = ["method", "round", "clients", "sampled", "round_s", "round_cpu_s", "configure_s", "aggregate_s", "evaluate_s",
          "prepare_s", "peak_growth_mb", "device", "command", "commit"]


def read_rows(path: Path) -> list[dict]:
    """The rows of a table.csv (one written before rounds, commands and commits were recorded: round 1, no
    command or commit)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    out = []
    for r in rows:
        row = {k: float(v) for k, v in r.items()
               if k not in ("method", "command", "commit", "device") and v not in (None, "")}
        row.update({"method": r["method"], "clients": int(row["clients"]), "round": int(row.get("round", 1)),
                    "sampled": int(row["sampled"]), "command": r.get("command") or "", "commit": r.get("commit") or "",
                    "device": r.get("device") or "cpu"})
        out.append(row)
    return out


def _label(row: dict) -> str:
    return row["method"] if row.get("round", 1) == 1 else f"{row['method']} (round {row['round']})"


def _made_lines(rows: list[dict]) -> list[str]:
    """Which command at which commit made which rows (several when rows were merged)."""
    groups: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        labels = groups.setdefault((r.get("command") or "", r.get("commit") or ""), [])
        if _label(r) not in labels:
            labels.append(_label(r))
    if len(groups) == 1:
        (command, commit), _ = next(iter(groups.items()))
        if command:
            return [f"Made by `{command}` at commit `{commit}`."]
        return ["Made by `make bench-server` before commands and commits were recorded."]
    lines = []
    for (command, commit), labels in groups.items():
        which = ", ".join(labels)
        lines.append(f"Rows {which}: made by `{command}` at commit `{commit}`." if command else
                     f"Rows {which}: made by `make bench-server` before commands and commits were recorded.")
    return lines


def write(rows: list[dict], out: Path) -> None:
    fields = FIELDS
    with open(out / "table.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    counts = sorted({r["clients"] for r in rows})
    methods = list(dict.fromkeys(_label(r) for r in rows))
    by = {(_label(r), r["clients"]): r for r in rows}
    devices = list(dict.fromkeys(r.get("device") or "cpu" for r in rows))
    if len(devices) == 1:
        device_lines = [f"Server device (`server-device`): {devices[0]}."]
    else:
        device_lines = [f"Server device of {', '.join(dict.fromkeys(_label(r) for r in rows if r.get('device') == d))}:"
                        f" {d}." for d in devices]
    lines = [*_made_lines(rows), *device_lines, "",
             "Seconds per round on the server, wall / CPU (configure + aggregate + evaluate; round 0 in brackets "
             f"where a method has one) and peak-memory growth, CNN on 28x28, target < {TARGET_S} s at 1,000 clients.",
             "",
             "| method | " + " | ".join(f"{n} clients" for n in counts) + f" | MB at {counts[-1]} |",
             "|---|" + "---|" * (len(counts) + 1)]
    for m in methods:
        cells = []
        for n in counts:
            r = by.get((m, n))
            if r is None:
                cells.append("-")
                continue
            cell = f"{r['round_s']:.3f} / {r['round_cpu_s']:.3f}"
            if r["prepare_s"] > 0.001:
                cell += f" ({r['prepare_s']:.3f})"
            cells.append(cell)
        last = by.get((m, counts[-1]))
        lines.append(f"| {m} | " + " | ".join(cells) + (f" | {last['peak_growth_mb']:.0f} |" if last else " | - |"))
    lines += _alone_notes(rows, counts)
    if any(r["method"] == "matrix-product floor" for r in rows):
        lines += ["", "matrix-product floor: one m x d by d x m float32 product (m = clients, d = the CNN's "
                  "parameters) on the server device, operands already there, timed in the same run (median of 5)."]
    lines += _movement_notes(rows, counts)
    (out / "table.md").write_text("\n".join(lines) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for m in methods:
        pts = [(n, by[(m, n)]["round_s"]) for n in counts if (m, n) in by]
        ax.plot(*zip(*pts), marker="o", label=m)
    ax.axhline(TARGET_S, color="grey", linestyle=":", label=f"target {TARGET_S} s")
    ax.set(xscale="log", yscale="log", xlabel="clients", ylabel="server seconds per round",
           title="Server time per round (CNN, 28x28)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "server_time.png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="10,100,1000")
    parser.add_argument("--methods", default="", help="comma-separated (default: every registered method)")
    parser.add_argument("--out", type=Path, default=Path("docs/results/server-time"))
    parser.add_argument("--run-config", default="{}", help="extra run-config keys as JSON")
    parser.add_argument("--round", type=int, default=1, help="time this round, after the ones before it (untimed)")
    parser.add_argument("--merge", action="store_true",
                        help="keep the existing table.csv's rows that this run does not measure")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="the server device of the timed rounds (run-config server-device; default: the "
                             "run config's, else cpu)")
    parser.add_argument("--one", nargs=3, metavar=("METHOD", "CLIENTS", "EXTRA"), help=argparse.SUPPRESS)
    parser.add_argument("--floor", nargs=2, metavar=("CLIENTS", "EXTRA"), help=argparse.SUPPRESS)
    parser.add_argument("--movement", type=int, metavar="CLIENTS", help=argparse.SUPPRESS)
    parser.add_argument("--allow-dirty", action="store_true",
                        help="write a docs/ table from uncommitted code (to try things)")
    args = parser.parse_args(argv)
    if args.one:
        method, n, extra = args.one
        print(json.dumps(measure(method, int(n), json.loads(extra), args.round)))
        return 0
    if args.floor:
        print(json.dumps(product_floor(int(args.floor[0]), json.loads(args.floor[1]))))
        return 0
    if args.movement:
        print(json.dumps(movement_floor(args.movement)))
        return 0
    from fedcore.registry import REGISTRY

    from runner.provenance import benchmark_command, guard, tree_commit

    guard(args.out, args.allow_dirty)  # a docs/ table is made from committed code only (the parent checks)

    methods = args.methods.split(",") if args.methods else list(REGISTRY)
    command = benchmark_command("benchmarks.server_time", argv)
    extra = json.loads(args.run_config)
    extra["server-device"] = args.device or extra.get("server-device", "cpu")
    run(methods, [int(c) for c in args.clients.split(",")], args.out, extra, args.round,
        {"command": command, "commit": tree_commit()}, args.merge)
    print((args.out / "table.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
