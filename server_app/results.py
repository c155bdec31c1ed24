"""Results of one run: resolved config, per-round and per-client CSVs, summary.json and plots.

Rows are written every round, so a run that dies still leaves what it measured. A run folder is
never reused silently: a fresh run needs an empty or new folder (``overwrite`` replaces an old
one), and ``resume`` continues one from its checkpoint with the rows of later rounds removed.

With a validation split (``val-fraction`` > 0) every evaluated round also has the clients' accuracy
on it, and the summary picks its round on validation: ``test_acc_at_best_val`` is the test accuracy
of the round best on validation, the number to compare methods by. ``best_acc`` stays what it always
was, the best test accuracy over the rounds (best-of-test: optimistic, chosen on the test split).

A round that evaluated only a sample of the clients (``fraction-evaluate`` < 1) has the sample's size in
``sampled_eval``; every accuracy of the summary comes from the other, complete rounds (``complete_rounds``).
"""

from __future__ import annotations

import csv
import json
import math
import shutil
import time
from pathlib import Path

import numpy as np

ROUND_FIELDS = ["round", "acc_weighted", "acc_client_mean", "acc_client_std", "loss", "train_loss",
                "bytes_up", "bytes_down", "eval_bytes_down", "wall_s", "eval_s", "startup_s", "replies", "dropped",
                "eval_clients", "state_round_min", "state_lost"]
CLIENT_FIELDS = ["round", "partition_id", "accuracy", "test_samples"]
VAL_FIELDS = ["val_acc_weighted", "val_acc_client_mean", "val_loss"]  # after acc_client_std, with validation
VAL_CLIENT_FIELDS = ["val_accuracy", "val_samples"]
PLACEMENT_FIELDS = ["round", "phase", "partition_id", "node_ip", "ray_node_id", "host", "pid"]
LAST_K = 10  # summary's "mean of the last evaluations": harder to flatter than a best-of-test
# a round that evaluated a sample of the clients (fraction-evaluate < 1) has the sample's size in this column (a column
# only runs with such rounds have); every summary accuracy comes from the rounds where every client was asked
SAMPLED_EVAL = "sampled_eval"


def validation_columns(evaluation) -> dict:
    """A round's validation columns from the strategy's evaluation metrics (none without validation)."""
    if evaluation is None or "val-acc-weighted" not in evaluation:
        return {}
    return {"val_acc_weighted": evaluation["val-acc-weighted"], "val_acc_client_mean": evaluation["val-acc-client-mean"],
            "val_loss": evaluation["val-loss"]}


def best_validation(rows: list[dict]) -> dict:
    """The rounds best on validation and the test accuracy there, from rounds.csv rows.

    ``best_val_round`` is the evaluated round with the highest weighted validation accuracy (the
    earliest of equals) and ``test_acc_at_best_val`` that round's weighted test accuracy;
    ``best_val_round_client_mean`` and ``test_client_acc_mean_at_best_val`` the same on the client
    means. All None when no round has a validation accuracy (``val-fraction`` = 0).
    """
    out = {}
    for suffix, val_col, test_col, test_key in (
            ("", "val_acc_weighted", "acc_weighted", "test_acc_at_best_val"),
            ("_client_mean", "val_acc_client_mean", "acc_client_mean", "test_client_acc_mean_at_best_val")):
        scored = [r for r in rows if _is_number(r.get(val_col)) and _is_number(r.get(test_col))]
        best = max(scored, key=lambda r: r[val_col]) if scored else {}
        out[f"best_val_round{suffix}"] = best.get("round")
        out[f"best_val_acc{suffix}"] = best.get(val_col)
        out[test_key] = best.get(test_col)
    return out


def default_run_name(cfg) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    from partitions.sources import is_source, short_name

    dataset = short_name(cfg["dataset"]) if is_source(cfg["dataset"]) else cfg["dataset"]  # no path in a folder name
    return f"{cfg['method']}-{dataset}-{cfg['partition'].replace(':', '-')}-s{cfg['seed']}-{stamp}"


class RunFolderError(RuntimeError):
    """The results folder cannot be used as asked (it holds another run, or there is nothing to resume)."""


def run_folder(cfg) -> Path:
    """The run's results folder, checked against the rules, before anything is started or written:
    a fresh run needs a new or empty folder unless ``overwrite``; ``resume`` needs an existing one."""
    root = Path(cfg["results-dir"]).expanduser().resolve()
    if not cfg["run-name"]:
        if cfg["resume"]:
            raise RunFolderError("resume needs the run-name of the run to continue")
        base = default_run_name(cfg)
        folder, k = root / base, 2
        while folder.exists():  # two runs started in the same second
            folder, k = root / f"{base}-{k}", k + 1
        return folder
    folder = root / cfg["run-name"]
    if cfg["resume"]:
        if not (folder / "checkpoints").is_dir():
            raise RunFolderError(f"resume: {folder} has no checkpoints to continue from")
    elif folder.exists() and any(folder.iterdir()) and not cfg["overwrite"]:
        raise RunFolderError(f"results folder {folder} already holds a run; choose another run-name, set "
                             "resume=true to continue it, or overwrite=true to replace it")
    return folder


class ResultsWriter:
    """Writes one run's results folder; ``resume`` = the checkpoint's writer state to continue from."""

    def __init__(self, cfg, folder: Path | None = None, resume: dict | None = None):
        self.cfg = cfg
        self.dir = folder or run_folder(cfg)
        if resume is None and self.dir.exists() and cfg["overwrite"]:
            shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2, sort_keys=True))
        self.rounds: list[dict] = list(resume["rounds"]) if resume else []
        self._elapsed_before = resume["elapsed"] if resume else 0.0
        self._start = time.monotonic()
        self.startup_from = "ServerApp start"  # what startup_s counts from (the launcher's runs: "command start")
        validation = cfg.get("val-fraction", 0.0) > 0
        self._columns = list(ROUND_FIELDS)
        if validation:
            at = self._columns.index("acc_client_std") + 1
            self._columns[at:at] = VAL_FIELDS
        self._client_fields = CLIENT_FIELDS + (VAL_CLIENT_FIELDS if validation else [])
        self.label_counts: np.ndarray | None = None  # clients x classes, drawn in finish
        self._write_rounds()
        if resume:
            self._truncate_to(self.rounds[-1]["round"] if self.rounds else -1)
        else:
            with open(self.dir / "clients.csv", "w", newline="") as f:
                csv.DictWriter(f, self._client_fields).writeheader()
            with open(self.dir / "placement.csv", "w", newline="") as f:
                csv.DictWriter(f, PLACEMENT_FIELDS).writeheader()

    def _truncate_to(self, last_round: int) -> None:
        """Remove what rounds after the checkpoint left behind: clients.csv rows, matrices, the old summary."""
        for name, fields in (("clients.csv", self._client_fields), ("placement.csv", PLACEMENT_FIELDS)):
            path = self.dir / name
            rows = list(csv.DictReader(open(path))) if path.exists() else []
            with open(path, "w", newline="") as f:
                w = csv.DictWriter(f, fields)
                w.writeheader()
                w.writerows(r for r in rows if int(r["round"]) <= last_round)
        for matrix in (self.dir / "round_matrices").glob("*.json"):
            if int(matrix.stem) > last_round:
                matrix.unlink()
        for name in ("summary.json", "dropped.json"):
            (self.dir / name).unlink(missing_ok=True)

    def state(self) -> dict:
        """What a checkpoint needs to continue writing this folder."""
        return {"rounds": list(self.rounds), "elapsed": self.elapsed()}

    def elapsed(self) -> float:
        return self._elapsed_before + time.monotonic() - self._start

    def _write_rounds(self) -> None:
        """rounds.csv, rewritten whole (write, then rename) so that a method's own columns, which
        may first appear in a later round, get a header; a crash never leaves a half-written file."""
        for row in self.rounds:
            self._columns += [k for k in row if k not in self._columns]
        tmp = self.dir / "rounds.csv.tmp"
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, self._columns, restval="")
            writer.writeheader()
            writer.writerows(self.rounds)
        tmp.replace(self.dir / "rounds.csv")

    def _append(self, name: str, fields: list[str], rows: list[dict]) -> None:
        with open(self.dir / name, "a", newline="") as f:
            csv.DictWriter(f, fields).writerows(rows)

    def write_label_counts(self, pids: list[int], train_counts: np.ndarray, test_counts: np.ndarray) -> None:
        """Per-client label counts (train + test) as CSV now; their heatmap is drawn with the other
        plots in ``finish`` (importing matplotlib and drawing took 0.5 s between the clients'
        handshake and round 1)."""
        counts = train_counts + test_counts
        with open(self.dir / "label_counts.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["partition_id", "num_train", "num_test", *[f"class_{c}" for c in range(counts.shape[1])]])
            for pid, tr, te, row in zip(pids, train_counts.sum(1), test_counts.sum(1), counts):
                w.writerow([pid, int(tr), int(te), *map(int, row)])
        self.label_counts = counts

    def add_round(self, row: dict, client_eval: dict | None, matrices: dict | None = None) -> None:
        """One round's row (round 0 = the preparation phase), its per-client accuracies and the
        matrices the strategy recorded (``round_matrices/<round>.json``)."""
        self.rounds.append(row)
        self._write_rounds()
        if matrices:
            folder = self.dir / "round_matrices"
            folder.mkdir(exist_ok=True)
            (folder / f"{row['round']:04d}.json").write_text(
                json.dumps({k: np.asarray(v).tolist() for k, v in matrices.items()}))
        if client_eval:
            rows = [{"round": row["round"], "partition_id": pid, "accuracy": acc, "test_samples": n}
                    for pid, acc, n in zip(client_eval["client-pids"], client_eval["client-acc"], client_eval["client-n"])]
            if "client-val-pids" in client_eval:  # the same clients' validation accuracy
                val = {pid: (acc, n) for pid, acc, n in zip(client_eval["client-val-pids"], client_eval["client-val-acc"],
                                                            client_eval["client-val-n"])}
                for r in rows:
                    r["val_accuracy"], r["val_samples"] = val.get(r["partition_id"], ("", ""))
            self._append("clients.csv", self._client_fields, rows)

    def add_placement(self, server_round: int, phase: str, replies) -> None:
        """placement.csv: which host, process and (under Ray) cluster node computed each reply of a phase;
        error replies and replies without a ``placement`` record (a fault-injected one) have no row."""
        from fedcore import wire  # here: the launcher's config check imports this module without Flower

        rows = []
        for msg in replies:
            where = wire.placement_of(msg)
            if where is not None and wire.PARTITION_ID in msg.content.get(wire.METRICS, {}):
                rows.append({"round": server_round, "phase": phase,
                             "partition_id": int(msg.content[wire.METRICS][wire.PARTITION_ID]),
                             "node_ip": where["node-ip"], "ray_node_id": where["ray-node-id"],
                             "host": where["host"], "pid": where["pid"]})
        if rows:
            self._append("placement.csv", PLACEMENT_FIELDS, sorted(rows, key=lambda r: r["partition_id"]))

    def finish(self, num_clients: int, dropped: list[dict], status: str = "completed") -> dict:
        evaluated = [r for r in self.rounds if _is_number(r.get("acc_weighted"))]
        final_round = max((r["round"] for r in self.rounds), default=None)
        last = evaluated[-1] if evaluated and evaluated[-1]["round"] == final_round else {}
        training = [r for r in self.rounds if r["round"] > 0]
        prepare = [r for r in self.rounds if r["round"] == 0]
        n_rounds = len(training)
        bytes_up = sum(r.get("bytes_up", 0) for r in self.rounds)
        bytes_down = sum(r.get("bytes_down", 0) for r in self.rounds)
        train_up = sum(r.get("bytes_up", 0) for r in training)
        train_down = sum(r.get("bytes_down", 0) for r in training)
        summary = {
            "method": self.cfg["method"], "dataset": self.cfg["dataset"], "partition": self.cfg["partition"],
            "model": self.cfg["model"], "seed": self.cfg["seed"], "num_clients": num_clients, "rounds": n_rounds,
            **accuracy_summary(evaluated, final_round), "val_fraction": self.cfg.get("val-fraction", 0.0),
            "final_round": final_round, "final_eval_clients": last.get("eval_clients", 0),
            "bytes_up": bytes_up, "bytes_down": bytes_down,
            "bytes_prepare": sum(r.get("bytes_up", 0) + r.get("bytes_down", 0) for r in prepare),
            "bytes_up_per_round": train_up / max(n_rounds, 1), "bytes_down_per_round": train_down / max(n_rounds, 1),
            # wall_s: from all clients connected (this writer's creation) to the last round's end, over
            # every resumption; start-up (from startup_from to the first round: round 0 where there is
            # one) and round 1, which warms up every client, are reported apart; the per-round figure
            # is the steady state of the rounds after them
            "wall_s": self.elapsed(),
            "startup_s": next((r["startup_s"] for r in self.rounds if _is_number(r.get("startup_s"))), None),
            "startup_from": self.startup_from,
            "first_round_s": training[0].get("wall_s") if training else None,
            "wall_s_per_round": _mean(r.get("wall_s", 0.0) for r in (training[1:] or training)) or 0.0,
            "dropped_replies": len(dropped), "status": status, "results_dir": str(self.dir),
        }
        (self.dir / "summary.json").write_text(json.dumps(summary, indent=2))
        if dropped:
            (self.dir / "dropped.json").write_text(json.dumps(dropped, indent=2, default=str))
        if self.cfg["plots"]:
            self._plot(evaluated)
        return summary

    def _plot(self, evaluated: list[dict]) -> None:
        if self.label_counts is not None:
            from partitions import plot_label_heatmap

            plot_label_heatmap(self.label_counts, str(self.dir / "label_counts.png"),
                               title=f"{self.cfg['dataset']} / {self.cfg['partition']}: samples per client and class")
        if evaluated:
            plot_accuracy(evaluated, self.dir / "accuracy.png", title=f"{self.cfg['method']} on {self.cfg['dataset']}")
        plot_round_matrices(self.dir / "round_matrices", title=self.cfg["method"])
        if (self.dir / "round_matrices").is_dir():  # what the recorded matrices did over the rounds (issue #30)
            plot_method_metrics(self.rounds, self.dir / "round_matrices" / "metrics.png", title=self.cfg["method"])


def complete_rounds(evaluated: list[dict]) -> list[dict]:
    """The evaluated rows where every client was asked to evaluate (not a ``fraction-evaluate`` sample): a
    sample's accuracy is of other clients each round, so no best round or mean over rounds is taken from it."""
    return [r for r in evaluated if not _is_number(r.get(SAMPLED_EVAL))]


def accuracy_summary(evaluated: list[dict], final_round: int | None) -> dict:
    """Every accuracy of a run's summary from its evaluated rounds.csv rows (also what recomputes a table
    from the per-run data in docs/results): final, best-of-test, last-10 mean, at the best-validation round,
    and the same for each method evaluation column, all over the complete rounds (``complete_rounds``)."""
    evaluated = complete_rounds(evaluated)
    # "final" is the last round's evaluation; if that one failed there is no final accuracy
    last = evaluated[-1] if evaluated and evaluated[-1]["round"] == final_round else {}
    # best-of-test: the round best on the test split itself (optimistic); compare methods by
    # test_acc_at_best_val (best_validation) where there is a validation split
    best = max(evaluated, key=lambda r: r["acc_weighted"]) if evaluated else {}
    best_mean = max(evaluated, key=lambda r: r["acc_client_mean"]) if evaluated else {}
    tail = evaluated[-LAST_K:]
    return {
        "final_acc": last.get("acc_weighted"), "best_acc": best.get("acc_weighted"), "best_round": best.get("round"),
        "client_acc_mean": last.get("acc_client_mean"), "client_acc_std": last.get("acc_client_std"),
        "best_client_acc_mean": best_mean.get("acc_client_mean"), "best_client_mean_round": best_mean.get("round"),
        **best_validation(evaluated),
        f"last{LAST_K}_acc": _mean(r["acc_weighted"] for r in tail),
        f"last{LAST_K}_client_acc_mean": _mean(r["acc_client_mean"] for r in tail),
        **_method_summary(evaluated),
    }


def _method_summary(evaluated: list[dict]) -> dict:
    """Final, best and last-10 mean of every method evaluation column (``eval_<name>``, e.g.
    R-pFedPM's relation-module accuracy), so comparisons can report them beside the head's; with
    the column on validation (``eval_val_<name>``), its value at the round best there
    (``eval_<name>_at_best_val``)."""
    names = {k for r in evaluated for k in r if k.startswith("eval_") and k not in ("eval_clients", "eval_bytes_down", "eval_s")
             and not k.startswith("eval_val_")}
    out = {}
    for name in sorted(names):
        values = [r[name] for r in evaluated if _is_number(r.get(name))]
        if values:
            out[f"final_{name}"] = values[-1]
            out[f"best_{name}"] = max(values)
            out[f"last{LAST_K}_{name}"] = _mean(values[-LAST_K:])
        val_name = "eval_val_" + name.removeprefix("eval_")
        scored = [r for r in evaluated if _is_number(r.get(val_name)) and _is_number(r.get(name))]
        if scored:
            out[f"{name}_at_best_val"] = max(scored, key=lambda r: r[val_name])[name]
    return out


def _mean(values) -> float | None:
    values = list(values)
    return float(np.mean(values)) if values else None


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def plot_accuracy(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = [r["round"] for r in rows]
    mean = np.array([r["acc_client_mean"] for r in rows])
    std = np.array([r["acc_client_std"] for r in rows])
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(rounds, [r["acc_weighted"] for r in rows], label="weighted accuracy")
    ax.plot(rounds, mean, "--", label="client mean")
    ax.fill_between(rounds, mean - std, mean + std, alpha=0.2, label="client mean ± std")
    if all(_is_number(r.get("val_acc_weighted")) for r in rows):
        ax.plot(rounds, [r["val_acc_weighted"] for r in rows], ":", label="validation accuracy (weighted)")
    ax.set(xlabel="round", ylabel="personalised test accuracy", title=title, ylim=(0, 1))
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_method_metrics(rows: list[dict], path: Path, title: str = "") -> Path | None:
    """The strategy's own numbers over the rounds (the ``m_*`` columns of rounds.csv: FedSaC's mean
    self-weight, row entropy, distance to p, mean and spread of S and C), one panel each."""
    names = [k for k in dict.fromkeys(k for r in rows for k in r)
             if k.startswith("m_") and any(_is_number(r.get(k)) and r["round"] > 0 for r in rows)]
    if not names:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(names))
    fig, axes = plt.subplots(-(-len(names) // cols), cols, figsize=(4 * cols, 2.6 * -(-len(names) // cols)),
                             squeeze=False, layout="constrained")
    for ax, name in zip(axes.flat, names):
        points = [(r["round"], r[name]) for r in rows if r["round"] > 0 and _is_number(r.get(name))]
        ax.plot(*zip(*points), marker=".")
        ax.set(title=name[2:], xlabel="round")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.suptitle(f"{title}: per-round metrics" if title else "per-round metrics")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _num(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def plot_round_matrices(folder: Path, title: str = "", annotate_up_to: int = 12) -> list[Path]:
    """Heatmaps of the square matrices a method recorded (``round_matrices/<round>.json``): for each
    name, its first, middle and last recorded round side by side on one colour scale, written to
    ``round_matrices/<name>.png`` (FedSaC's collaboration graph, attention weights). Matrices up to
    ``annotate_up_to`` rows show their values. Returns the files written."""
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    if not files:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    picks = sorted({0, len(files) // 2, len(files) - 1})
    rounds = [(int(files[i].stem), json.loads(files[i].read_text())) for i in picks]
    names = dict.fromkeys(name for _, mats in rounds for name in mats)
    written = []
    for name in names:
        shown = [(rnd, np.asarray(mats[name], dtype=float)) for rnd, mats in rounds if name in mats]
        shown = [(rnd, m) for rnd, m in shown if m.ndim == 2 and m.shape[0] == m.shape[1] and m.size]
        if not shown:
            continue
        low, high = min(m.min() for _, m in shown), max(m.max() for _, m in shown)
        fig, axes = plt.subplots(1, len(shown), figsize=(4.2 * len(shown), 3.8), squeeze=False, layout="constrained")
        for ax, (rnd, m) in zip(axes[0], shown):
            image = ax.imshow(m, vmin=low, vmax=high, cmap="viridis")
            ax.set(title=f"round {rnd}", xlabel="column", ylabel="row")
            if len(m) <= annotate_up_to:
                ax.set(xticks=range(len(m)), yticks=range(len(m)))
                for (i, j), value in np.ndenumerate(m):
                    ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=6,
                            color="white" if value < (low + high) / 2 else "black")
        fig.colorbar(image, ax=list(axes[0]), shrink=0.9)
        fig.suptitle(f"{title}: {name}" if title else name)
        path = folder / f"{name}.png"  # a name such as "attention/body.0" gets its own sub-folder
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def format_summary(summary: dict) -> str:
    """A small text table of a finished run, for logs and the terminal."""
    def pct(v):
        return "-" if v is None else f"{100 * v:.2f}"

    rows = [
        ("method", summary["method"]), ("dataset / partition", f"{summary['dataset']} / {summary['partition']}"),
        ("clients x rounds", f"{summary['num_clients']} x {summary['rounds']}"),
        ("final acc (weighted) %", pct(summary["final_acc"])),
    ]
    if summary.get("test_acc_at_best_val") is not None:
        rows += [
            ("test acc at best-val round (weighted) %", f"{pct(summary['test_acc_at_best_val'])} (round "
             f"{summary['best_val_round']}, validation {pct(summary['best_val_acc'])})"),
            ("test acc at best-val round (client mean) %", f"{pct(summary['test_client_acc_mean_at_best_val'])} "
             f"(round {summary['best_val_round_client_mean']})"),
        ]
    else:  # no validation split (val-fraction = 0): the round can only be picked on test, which flatters
        rows += [("best-of-test acc (optimistic) %", f"{pct(summary['best_acc'])} (round {summary['best_round']})")]
    rows += [
        ("client acc mean ± std %", f"{pct(summary['client_acc_mean'])} ± {pct(summary['client_acc_std'])}"),
        ("MB up / down per round", f"{summary['bytes_up_per_round'] / 1e6:.3f} / {summary['bytes_down_per_round'] / 1e6:.3f}"),
        (f"start-up s ({summary.get('startup_from', 'start')} to first round)", _num(summary.get("startup_s"))),
        ("wall s (clients connected to last round's end)", f"{summary['wall_s']:.1f}"),
        ("s per round: round 1, mean of the rest", f"{_num(summary.get('first_round_s'))}, "
         f"{summary['wall_s_per_round']:.2f}"),
        ("dropped replies", str(summary["dropped_replies"])),
        ("results", summary["results_dir"]),
    ]
    width = max(len(k) for k, _ in rows)
    line = "+" + "-" * (width + 2) + "+" + "-" * 50 + "+"
    body = "\n".join(f"| {k:<{width}} | {str(v):<48} |" for k, v in rows)
    return f"{line}\n{body}\n{line}"
