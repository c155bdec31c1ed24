"""Why FedSaC's self-weight W_ii collapses (issue #30): ``python -m benchmarks.studies.fedsac_self_weight``.

Runs FedSaC (and pFedGraph, its alpha = 0 ancestor) in-process on mnist5k, Dirichlet(0.1), 10 clients, one
seed, and for every round reads back the recorded p, S, C and W (round_matrices/<round>.json) to report:

- the graph diagnostics of rounds.csv (mean W_ii, row entropy, mean |W - p|, off-diagonal S and C);
- the share of pairs (i, j) where the QP's target for w_ij beats its target for w_ii, i.e.
  beta S_ij - alpha C_ij > beta S_ii - alpha C_ii = beta - alpha (Eq. 8's objective rewards j over i);
- the largest gap between our W and an independent cvxpy solve of the authors' per-row problem
  (``quad_form(x, I) + (alpha c + beta s - 2 p) @ x`` with s = -S) from the same p, S, C: zero means
  the collapse comes from the equations and their inputs, not from our solver.

Writes ``<out>/table.md`` (the full command and the commit that made it on its first line; a table under docs/
only from committed code, ``runner.provenance.guard``), the per-round plots ``metrics-<method>.png`` and
``graph-<method>.png`` beside it, and the runs under ``<out>/runs``:

    python -m benchmarks.studies.fedsac_self_weight --rounds 20 --out docs/results/fedsac-self-weight
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
from pathlib import Path

import numpy as np

BASE = {"dataset": "mnist5k", "partition": "dirichlet", "dirichlet.alpha": 0.1, "dirichlet.min-size": 10,
        "model": "simplecnn", "local-steps": 15, "batch-size": 64, "lr": 0.01, "momentum": 0.9, "weight-decay": 1e-5,
        "seed": 0, "client-threads": 1, "plots": True, "eval-every": 5, "node-wait-s": 0,
        "overwrite": True}


def authors_rows(p, s, c, alpha, beta):
    """The authors' per-row QP (FedSaC/utils.py, optimizing_graph_matrix_neighbor), one cvxpy solve per row."""
    import cvxpy as cp

    n = len(p)
    rows = []
    for i in range(n):
        x = cp.Variable(n)
        q = alpha * c[i] + beta * (-s[i]) - 2 * p
        cp.Problem(cp.Minimize(cp.sum_squares(x) + q @ x), [x >= 0, cp.sum(x) == 1]).solve(solver=cp.CLARABEL)
        rows.append(x.value)
    return np.array(rows)


def analyse(folder: Path, method: str, alpha_of, beta: float, sizes: np.ndarray) -> list[dict]:
    rows = []
    rounds = {int(r["round"]): r for r in csv.DictReader(open(folder / "rounds.csv")) if int(r["round"]) > 0}
    for path in sorted((folder / "round_matrices").glob("*.json")):
        rnd = int(path.stem)
        m = {k: np.array(v) for k, v in json.loads(path.read_text()).items()}
        w, s, pids = m["graph"], m["similarity"], m["pids"]
        c = m.get("complementarity", np.zeros_like(s))
        p = sizes[pids] / sizes[pids].sum()
        alpha = alpha_of(rnd)
        off = ~np.eye(len(w), dtype=bool)
        gain = beta * s - alpha * c
        beats_self = (gain > (beta * np.diag(s) - alpha * np.diag(c))[:, None]) & off
        row = rounds[rnd]
        rows.append({"method": method, "round": rnd, "alpha": alpha, "W_ii": float(np.diag(w).mean()),
                     "entropy": float(row["m_row_entropy"]), "|W-p|": float(row["m_dist_to_p"]),
                     "S off": float(s[off].mean()), "S std": float(s[off].std()),
                     "C off": float(c[off].mean()), "C diag": float(np.diag(c).mean()),
                     "pairs beating self": float(beats_self.sum() / off.sum()),
                     "max |W - authors|": float(np.abs(w - authors_rows(p, s, c, alpha, beta)).max())})
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("results/fedsac-self-weight"))
    parser.add_argument("--allow-dirty", action="store_true",
                        help="write a docs/ table from uncommitted code (the table then says so in bold)")
    args = parser.parse_args(argv)
    from runner import provenance
    from runner.inprocess import run_inprocess

    from fedcore.config import Config
    from fedstrategies.fedsac_math import alpha_at

    dirty = provenance.guard(args.out, args.allow_dirty)
    code = provenance.stamp()
    table, finals = [], []
    for method in ("fedsac", "pfedgraph"):
        config = {**BASE, "method": method, "num-server-rounds": args.rounds, "results-dir": str(args.out / "runs"),
                  "run-name": method}
        summary, _ = run_inprocess(config, 10)
        folder = Path(summary["results_dir"])
        sizes = {int(r["partition_id"]): int(r["num_train"]) for r in csv.DictReader(open(folder / "label_counts.csv"))}
        hp = Config.from_run_config(config).hparams()
        if method == "fedsac":
            alpha_of = lambda r, hp=hp: alpha_at(r, args.rounds, hp["alpha"], hp["alpha-fraction"], hp["alpha-boundary"])  # noqa: E731
            beta = hp["beta"]
        else:
            alpha_of, beta = (lambda r: 0.0), 1.0 / hp["alpha"]
        # p_j is n_j of the reply: the client's training split (label_counts.csv's num_train)
        table += analyse(folder, method, alpha_of, beta, np.array([sizes[i] for i in range(10)], float))
        finals.append(f"{method} {100 * summary['final_acc']:.2f}%")
        for plot, name in (("metrics.png", "metrics"), ("graph.png", "graph")):
            if (folder / "round_matrices" / plot).exists():
                shutil.copyfile(folder / "round_matrices" / plot, args.out / f"{name}-{method}.png")
    keys = list(table[0])
    lines = [f"Made by `{provenance.command_line('benchmarks.studies.fedsac_self_weight', argv)}` at commit `{code['commit']}`"
             f" (source hash `{code['source_hash']}`)."
             + (" **Made from uncommitted code: not a result.**" if dirty else ""),
             f"Final weighted accuracy after {args.rounds} rounds: {', '.join(finals)} (one seed, not a comparison).",
             "", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in row.values()) + " |"
              for row in table]
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
