"""How Per-FedAvg's score depends on the batches it adapts on: ``python -m benchmarks.studies.peravg_test_adaptation``.

Per-FedAvg is scored after adapting the global model to each client. Its paper (and ``clients/per_fedavg.py``)
takes one step of size alpha on a *training* batch. The code FedMCSA's repository names as its base (pFedMe's,
github.com/CharlieDinh/pFedMe, ``FLAlgorithms/users/userperavg.py``, ``train_one_step``) takes two steps, the
meta-step's alpha then beta, on two batches of the client's *test* split, and then scores the client on that split.

This runs Per-FedAvg as a comparison preset's row runs it (its run config and tuned hyperparameters, one seed),
takes the final global model from the run's last checkpoint and scores every client five ways on its test split:
no adaptation; ours (one alpha step on a training batch); one alpha step on a test batch; alpha then beta on two
training batches (pFedMe's steps without the test data); pFedMe's code (alpha then beta on two test batches).
Each adaptation batch is a draw of ``batch-size`` samples, the same draws for every way that uses that split,
``--draws`` of them per client. Writes ``<out>/table.md`` (full command and commit on its first line; a table under
docs/ only from committed code, ``runner.provenance.guard``), ``<out>/scores.csv`` (every client's accuracy for each
draw and way) and the run's ``rounds.csv`` beside it, and the run under ``<out>/runs``:

    python -m benchmarks.studies.peravg_test_adaptation conf/fedmcsa-fmnist-mlr.toml --out docs/results/peravg-test-adaptation
"""

from __future__ import annotations

import argparse
import csv
import shutil
from pathlib import Path

import numpy as np
import torch

WAYS = ("global model, no adaptation", "ours: alpha step on a training batch", "alpha step on a test batch",
        "alpha then beta steps on two training batches", "pFedMe's code: alpha then beta steps on two test batches")


def step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor, size: float) -> None:
    """One plain gradient step of ``size`` on the batch ``idx`` of (x, y), as Per-FedAvg's adaptation takes it."""
    from clients.per_fedavg import gradient_fn, set_values

    w = [p.detach() for p in model.parameters()]
    g, _ = gradient_fn(model, x, y)(w, idx)
    set_values(model, [wi - size * gi for wi, gi in zip(w, g)])


def score_client(client, content, alpha: float, beta: float, draws: int) -> np.ndarray:
    """Accuracy on the client's test split for each of ``WAYS`` (columns), one row per draw of the adaptation
    batches. Draw 0's training batch is the one the run's own evaluation used (``clients.per_fedavg.ADAPT_TAG``)."""
    from clients.per_fedavg import ADAPT_TAG
    from clients.training import batch_stream, evaluate_model
    from fedcore import wire

    data, env, size = client.data, client.env, client.cfg["batch-size"]
    x, y = data.x_test, data.y_test

    def accuracy(model):
        _, correct, total = evaluate_model(model, x, y)
        return correct / max(total, 1)

    out = np.zeros((draws, len(WAYS)))
    out[:, 0] = accuracy(client.model_from(content, wire.WEIGHTS))
    for d in range(draws):
        train_batches = batch_stream(data.num_train, size, env.generator(ADAPT_TAG if d == 0 else 200 + d), env.device)
        train_idx, train_second = next(train_batches), next(train_batches)
        test_batches = batch_stream(len(y), size, env.generator(100 + d), env.device)
        first, second = next(test_batches), next(test_batches)
        ours, one, two_train, two = (client.model_from(content, wire.WEIGHTS) for _ in range(4))
        step(ours, data.x_train, data.y_train, train_idx, alpha)
        step(one, x, y, first, alpha)
        step(two_train, data.x_train, data.y_train, train_idx, alpha)
        step(two_train, data.x_train, data.y_train, train_second, beta)
        step(two, x, y, first, alpha)
        step(two, x, y, second, beta)
        out[d, 1:] = [accuracy(m) for m in (ours, one, two_train, two)]
    return out


def recorded_accuracy(run_dir: Path, server_round: int) -> str:
    """The run's own client-mean accuracy at ``server_round`` in %, "not evaluated" where it has none."""
    for row in csv.DictReader(open(run_dir / "rounds.csv")):
        if int(row["round"]) == server_round and row["acc_client_mean"]:
            return f"{100 * float(row['acc_client_mean']):.2f}"
    return "not evaluated"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preset", type=Path, nargs="?", default=Path("conf/fedmcsa-fmnist-mlr.toml"))
    parser.add_argument("--label", default="per-fedavg", help="the preset's Per-FedAvg row")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=None, help="default: the preset's")
    parser.add_argument("--draws", type=int, default=5, help="draws of the adaptation batches per client")
    parser.add_argument("--out", type=Path, default=Path("results/peravg-test-adaptation"))
    parser.add_argument("--allow-dirty", action="store_true",
                        help="write a docs/ table from uncommitted code (the table then says so in bold)")
    args = parser.parse_args(argv)
    from flwr.app import RecordDict

    from clients.base import ClientEnv
    from fedcore import wire
    from fedcore.config import Config
    from fedcore.registry import get_method
    from runner import provenance
    from runner.compare_presets import entries, load_preset, run_config
    from runner.inprocess import run_inprocess
    from server_app import checkpoints

    dirty = provenance.guard(args.out, args.allow_dirty)
    code = provenance.stamp()
    preset = load_preset(args.preset)
    (entry,) = entries(preset, [args.label])
    if entry.method != "per-fedavg":
        raise SystemExit(f"{args.preset}: row {args.label!r} runs {entry.method!r}, not per-fedavg")
    config = {**run_config(preset, entry, args.seed, args.out), "overwrite": True}
    if args.rounds is not None:
        config["num-server-rounds"] = args.rounds
    num_clients = int(preset["compare"].get("supernodes", 10))
    torch.set_num_threads(1)
    summary, _ = run_inprocess(config, num_clients)
    saved = checkpoints.latest(Path(summary["results_dir"]))
    content = RecordDict({wire.WEIGHTS: wire.pack_arrays(saved["strategy"]["method"]["global_weights"])})
    cfg = Config.from_run_config(config)
    alpha, beta = cfg.hparams()["alpha"], float(cfg["lr"])
    # acc[client, draw, way]
    acc = np.stack([score_client(get_method("per-fedavg").client(ClientEnv(cfg, pid, num_clients, RecordDict(),
                                                                           server_round=int(saved["round"]))),
                                 content, alpha, beta, args.draws) for pid in range(num_clients)])
    recorded = recorded_accuracy(Path(summary["results_dir"]), int(saved["round"]))
    lines = [f"Made by `{provenance.command_line('benchmarks.studies.peravg_test_adaptation', argv)}` at commit "
             f"`{code['commit']}` (source hash `{code['source_hash']}`)."
             + (" **Made from uncommitted code: not a result.**" if dirty else ""),
             f"Per-FedAvg as row `{args.label}` of `{args.preset.name}` runs it, seed {args.seed}, "
             f"{config['num-server-rounds']} rounds, {num_clients} clients; the final global model (round "
             f"{saved['round']}) scored on each client's test split; alpha = {alpha:g}, beta = lr = {beta:g}, "
             f"adaptation batches of {cfg['batch-size']}, {args.draws} draws of them per client. One seed: a measurement of the scoring, not a comparison.",
             "", f"The run's own evaluation of that round (rounds.csv, client mean): {recorded}; the row 'ours' "
             "repeats it with the same adaptation batch in draw 0: "
             f"{100 * acc[:, 0, 1].mean():.2f}.",
             "", "| scoring | client mean over draws (%) | std over draws of the client mean | minus ours (points) |",
             "|---|---|---|---|"]
    means = acc.mean(axis=0)  # [draw, way]: the client mean of each draw
    for k, way in enumerate(WAYS):
        lines.append(f"| {way} | {100 * means[:, k].mean():.2f} | {100 * means[:, k].std(ddof=1) if args.draws > 1 else 0:.2f} | "
                     f"{100 * (means[:, k] - means[:, 1]).mean():+.2f} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    with open(args.out / "scores.csv", "w", newline="") as f:  # the per-client data behind the table
        writer = csv.writer(f)
        writer.writerow(["partition_id", "draw", "scoring", "test_acc"])
        writer.writerows([pid, d, way, f"{acc[pid, d, k]:.6f}"] for pid in range(num_clients)
                         for d in range(args.draws) for k, way in enumerate(WAYS))
    shutil.copyfile(Path(summary["results_dir"]) / "rounds.csv", args.out / "rounds.csv")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
