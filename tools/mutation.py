"""Mutation testing of the paper methods, the rivals and the machinery behind every verdict (mutmut 3):
``python -m tools.mutation fedsac``, ``python -m tools.mutation stats --workers 1``.

Each target is mutated in its own copy of the project (``.mutation/<target>/``), so that targets can run
side by side and the working tree is never touched. Only the target's own modules are mutated and only its
fast tests run against each mutant. The report (docs/results/mutation/<method>.md) counts killed and
surviving mutants; a survivor listed in tests/mutation/<method>.toml as equivalent (same behaviour) or out
of scope (logging, error text) is left out of the ratio, with its one-line reason shown. After writing
tests for the survivors, ``--survivors`` tests only those again (``--report-only`` rewrites the report alone).
Each report records its modules' content hash; ``--stale`` lists the reports whose modules changed since, and
``--summary`` writes docs/results/mutation/README.md, every target's ratio. On a shared machine run one target at a
time with ``--workers 1`` (``make mutation METHOD=<target> WORKERS=1``).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".mutation"
REPORTS = ROOT / "docs" / "results" / "mutation"
ANNOTATIONS = ROOT / "tests" / "mutation"
KNOWN_STALE = ANNOTATIONS / "known-stale.toml"
TARGET_RATIO = 0.90
# the packages mutmut copies into its mutants/ tree (a target's modules must lie in one of them)
PACKAGES = ("fedcore", "fedstrategies", "clients", "server_app", "partitions", "runner", "benchmarks")


@dataclass(frozen=True)
class Target:
    """What is mutated for one method (or one piece of machinery) and which fast tests judge each mutant."""

    modules: tuple[str, ...]
    tests: tuple[str, ...]
    skip: tuple[str, ...] = ()  # functions left unmutated (drawing, display, another target's), named in the report
    only: tuple[str, ...] = ()  # where set, the only functions mutated (the module-level lines too), in the report
    copy: tuple[str, ...] = ()  # folders the tests read besides the code (docs/ for the committed tables)

    def left_out(self, source: str) -> dict[int, str]:
        """``def`` line -> name of each function or method of ``source`` left unmutated (``skip``, or not in
        ``only``); functions nested in another are judged with it."""
        tree = ast.parse(source)
        found = {}
        for parent in [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef))]:
            for node in parent.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                        node.name in self.skip or (self.only and node.name not in self.only)):
                    found[node.lineno] = node.name
        return found


TARGETS: dict[str, Target] = {
    "pfedpm": Target(("fedstrategies/pfedpm.py", "fedstrategies/prototypes.py", "clients/pfedpm.py"),
                     ("tests/test_pfedpm_rules.py",)),
    "fedmcsa": Target(("fedstrategies/fedmcsa.py", "fedstrategies/fedmcsa_math.py", "clients/fedmcsa.py",
                       "fedcore/methods/fedmcsa.py"),
                      ("tests/test_fedmcsa.py", "tests/test_fedmcsa_units.py")),
    "fedfcd": Target(("fedstrategies/fedfcd.py", "fedstrategies/fedfcd_math.py", "clients/fedfcd.py"),
                     ("tests/test_fedfcd_units.py", "tests/test_fedfcd.py")),
    "mupfl": Target(("fedstrategies/mupfl.py", "fedstrategies/mupfl_math.py", "clients/mupfl.py", "clients/bavd.py",
                     "fedcore/class_gradients.py", "fedstrategies/federated_features.py"),
                    ("tests/test_mupfl.py", "tests/test_mupfl_client.py", "tests/test_creff.py")),
    "fedsac": Target(("fedstrategies/fedsac.py", "fedstrategies/fedsac_math.py", "clients/fedsac.py"),
                     ("tests/test_fedsac.py", "tests/test_fedsac_units.py")),
    "fedgh": Target(("fedstrategies/fedgh.py", "clients/fedgh.py"), ("tests/test_rivals_heads.py",)),
    "fedrod": Target(("fedstrategies/fedrod.py", "clients/fedrod.py"), ("tests/test_rivals_heads.py",)),
    "gpfl": Target(("fedstrategies/gpfl.py", "clients/gpfl.py", "fedcore/conditional_valve.py"),
                   ("tests/test_rivals_heads.py",)),
    "fedamp": Target(("fedstrategies/fedamp.py", "fedstrategies/heurfedamp.py", "fedstrategies/fedamp_math.py",
                      "fedstrategies/pairwise.py", "clients/fedamp.py"),
                     ("tests/test_pairwise.py", "tests/test_rivals_cluster.py")),
    "cfl": Target(("fedstrategies/cfl.py", "fedstrategies/cfl_math.py", "clients/cfl.py"), ("tests/test_rivals_cluster.py",)),
    "fesem": Target(("fedstrategies/fesem.py", "fedstrategies/fesem_math.py", "clients/fesem.py"),
                    ("tests/test_rivals_cluster.py",)),
    "per-fedavg": Target(("fedstrategies/per_fedavg.py", "clients/per_fedavg.py"), ("tests/test_rivals_optim.py",)),
    "pfedme": Target(("fedstrategies/pfedme.py", "clients/pfedme.py"), ("tests/test_rivals_optim.py",)),
    "l2gd": Target(("fedstrategies/l2gd.py", "clients/l2gd.py"), ("tests/test_rivals_optim.py",)),
    # CReFF's re-training shares fedstrategies/federated_features.py with MuPFL (mutated there); its own code here
    "creff": Target(("fedstrategies/creff.py", "clients/creff.py"), ("tests/test_creff.py",)),
    # pFedGraph is FedSaC's server and client minus the feature subspace (fedsac*.py are mutated for FedSaC)
    "pfedgraph": Target(("fedstrategies/pfedgraph.py", "clients/pfedgraph.py"), ("tests/test_fedsac_pfedgraph.py",)),
    "fednova": Target(("fedstrategies/fednova.py", "clients/fednova.py", "fedcore/methods/fednova.py"),
                      ("tests/test_rivals_optim.py",)),
    # FedAvg's rule, the weighted mean every weight-averaging method shares (FedAvg-FT, FedProx, FedPer, FedRep,
    # Ditto, Per-FedAvg, L2GD, FedRoD, GPFL, CReFF, MuPFL's cluster means, FedNova's normalised average)
    "fedavg": Target(("fedstrategies/aggregate.py", "fedstrategies/fedavg.py"),
                     ("tests/test_aggregation.py",)),
    # the machinery behind every verdict: a table's statistics, best-on-validation selection, the tuning rule,
    # provenance and per-run data, checkpoints, reply validation, the partitioners and split files, the writers
    "stats": Target(("runner/stats.py", "runner/table.py"),
                    ("tests/test_provenance.py::test_the_paired_t_interval_matches_a_hand_computation",
                     "tests/test_provenance.py::test_sample_std_and_its_conversion_from_a_population_std",
                     "tests/test_stats_rules.py", "tests/test_paired.py"),
                    # runner/table.py's paired question (its rounds and moved questions are the tables target's)
                    only=("sample_std", "sample_from_population", "paired_difference", "difference_cell",
                          "headline_metric", "paired_rows", "render_paired", "parse_pair"), copy=("docs",)),
    "replies": Target(("fedstrategies/replies.py",), ("tests/test_replies_rules.py",)),
    "results": Target(("server_app/results.py",),
                      ("tests/test_results_rules.py",
                       "tests/test_validation.py::test_the_best_validation_round_and_the_test_accuracy_there"),
                      skip=("_plot", "plot_accuracy", "plot_method_metrics", "plot_round_matrices", "_num",
                            "format_summary")),
    "provenance": Target(("runner/provenance.py", "runner/run_data.py"), ("tests/test_provenance_rules.py",)),
    # the tuning rule: which setting is chosen, when the default is kept, and what the choice is judged on
    "tune": Target(("benchmarks/tune.py",),
                   ("tests/test_tune.py::test_the_choice_is_the_best_validation_accuracy_first_of_equals_and_ignores_failed_runs",
                    "tests/test_tune.py::test_noise_is_the_standard_error_of_a_difference_of_two_binomial_accuracies",
                    "tests/test_tune.py::test_the_default_stays_unless_a_setting_beats_it_by_more_than_noise",
                    "tests/test_tune.py::test_rechoose_applies_the_rule_to_a_family_files_numbers_and_runs_nothing",
                    "tests/test_tune.py::test_a_preset_without_a_validation_split_is_refused",
                    "tests/test_tune.py::test_budget_is_half_the_rounds_and_the_family_is_dataset_and_partition",
                    "tests/test_tune_rules.py"),
                   only=("choose", "noise", "default_setting", "check_validation", "tuning_budget", "tuned_path",
                         "rechoose", "validation_samples")),
    # which samples each client trains, validates and tests on (the schemes, the split file and its checks)
    "partitioners": Target(("partitions/partitioners.py",),
                           ("tests/test_partitions.py", "tests/test_partitioners_rules.py",
                            "--deselect=tests/test_partitions.py::test_determinism_across_processes",
                            "--deselect=tests/test_partitions.py::test_label_counts_and_heatmap",
                            "tests/test_validation.py::test_validation_comes_from_the_training_pool_and_leaves_train_and_test_disjoint",
                            "tests/test_validation.py::test_the_split_repeats_for_a_seed_and_differs_for_another",
                            "tests/test_validation.py::test_a_split_file_keeps_validation_in_its_training_lists",
                            "tests/test_validation.py::test_a_val_fraction_outside_0_1_is_refused",
                            "tests/test_validation.py::test_a_val_fraction_that_leaves_a_client_no_training_sample_is_refused"),
                           skip=("plot_label_heatmap",)),
    # the comparison table's rows, its writer and the README summary (and runner/table.py's rounds and moved)
    "tables": Target(("runner/compare_rows.py", "runner/compare_table.py", "benchmarks/summary.py", "runner/table.py"),
                     (  # runner/compare_rows.py and runner/compare_table.py's rules (issue #80, branch tables-writers)
                      "tests/test_compare_table_rules.py",
                      "tests/test_provenance.py::test_every_docs_table_with_per_run_data_recomputes_from_it",
                      "tests/test_provenance.py::test_the_dirty_table_says_so_in_bold_and_lists_its_runs_commits",
                      # the tables' first selection
                      "tests/test_compare.py::test_every_comparison_table_in_docs_is_what_the_current_code_renders_from_its_csv",
                      "tests/test_compare.py::test_the_papers_numbers_sit_beside_ours_in_the_papers_metric",
                      "tests/test_compare.py::test_a_paper_table_with_an_unknown_metric_or_row_is_refused",
                      "tests/test_compare.py::test_a_sweep_table_becomes_one_row_per_combination_and_bad_ones_are_refused",
                      "tests/test_compare.py::test_the_readme_summary_is_built_from_the_current_docs_tables",
                      "tests/test_compare.py::test_the_summary_compares_with_the_best_baseline_in_the_same_metric",
                      "tests/test_compare.py::test_the_summary_difference_carries_the_tables_paired_interval_and_says_tie",
                      "tests/test_compare.py::test_the_summary_leaves_out_a_table_whose_runs_are_not_all_made",
                      # the query command's and the README summary's rules (runner/table.py, benchmarks/summary.py)
                      "tests/test_table_queries.py", "tests/test_summary_rules.py", "tests/test_paired.py",
                      "tests/test_validation.py::test_comparison_tables_use_the_test_accuracy_at_the_best_validation_round",
                      "tests/test_rounds_to.py", "tests/test_moved.py"),
                     skip=("headline_metric", "paired_rows", "render_paired", "parse_pair"), copy=("docs",)),
    "checkpoints": Target(("server_app/checkpoints.py",),
                          ("tests/test_checkpoints.py::test_the_tree_holds_every_known_type_exactly",
                           "tests/test_checkpoints.py::test_a_value_of_an_unknown_type_is_refused_when_saving",
                           "tests/test_checkpoints.py::test_broken_files_are_refused_with_the_file_and_reason",
                           "tests/test_checkpoints.py::test_latest_skips_refused_files_to_the_previous_good_one",
                           "tests/test_checkpoints_rules.py")),
}

# Verdicts of mutmut 3 (`mutmut results --all true`) that count as a test catching the mutant.
CAUGHT = {"killed", "timeout", "caught by type check", "segfault"}
SURVIVED = {"survived", "no tests"}


def _copy_project(dest: Path) -> None:
    """The tracked and untracked-but-not-ignored files of the project, as a fresh tree."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    if dest.exists():
        shutil.rmtree(dest)
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


NO_MUTATE = "  # pragma: no mutate block"  # after a def's colon: mutmut leaves the whole function unmutated


def mark_left_out(path: Path, target: Target) -> list[str]:
    """Mark, in the mutation copy's ``path``, the functions ``target`` leaves unmutated; returns their names."""
    source = path.read_text()
    lines = source.splitlines(keepends=True)
    tree = ast.parse(source)
    nodes = {n.lineno: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    names = []
    for lineno, name in target.left_out(source).items():
        colon = nodes[lineno].body[0].lineno - 2  # the line before the body's first statement ends the header
        while not lines[colon].rstrip().endswith(":"):
            colon -= 1
        lines[colon] = lines[colon].rstrip("\n").rstrip() + NO_MUTATE + "\n"
        names.append(name)
    path.write_text("".join(lines))
    return names


def _mutmut_config(target: Target, workers: int) -> str:
    lists = lambda xs: "[" + ", ".join(json.dumps(x) for x in xs) + "]"  # noqa: E731
    return "\n".join([
        "", "[tool.mutmut]",
        f"source_paths = {lists(PACKAGES)}",
        f"only_mutate = {lists(target.modules)}",
        f"also_copy = {lists(['conf', 'tools', *target.copy])}",
        f"pytest_add_cli_args_test_selection = {lists(target.tests)}",
        # one process per mutant, no xdist inside it; the suite's timeout still ends a hung mutant
        'pytest_add_cli_args = ["-p", "no:xdist", "-p", "no:cacheprovider", "-x", "-q"]',
        'process_isolation = "forkserver"',
        # several methods' runs share 2 cores: a test slowed by the load must not read as a timeout (a false kill)
        "timeout_multiplier = 60.0",
        "",
    ])


def run(method: str, workers: int, fresh: bool, survivors: bool = False) -> float:
    """One method's mutation run. ``survivors``: test again only the mutants the last run left alive
    (and that tests/mutation/<method>.toml does not excuse), after new tests were written; mutmut's
    record of which tests reach which function is dropped so that the new tests are found."""
    target = TARGETS[method]
    work = WORK / method
    if survivors and not (work / "mutants").exists():
        raise SystemExit(f"--survivors needs a previous run of {method} (none in {work.relative_to(ROOT)})")
    if fresh or not work.exists():
        _copy_project(work)
    else:  # keep mutmut's cache of verdicts; refresh the sources and tests
        for name in filter(None, subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                                                check=True, capture_output=True).stdout.decode().split("\0")):
            if (ROOT / name).is_file():
                (work / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, work / name)
    for module in target.modules:
        mark_left_out(work / module, target)
    pyproject = work / "pyproject.toml"
    pyproject.write_text((ROOT / "pyproject.toml").read_text() + _mutmut_config(target, workers))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    mutmut = [sys.executable, "-m", "mutmut"]
    names: list[str] = []
    if survivors:
        notes = load_annotations(method)
        before = parse_results(subprocess.run([*mutmut, "results", "--all", "true"], cwd=work, env=env, check=True,
                                              capture_output=True, text=True).stdout)
        names = survivors_to_rerun(before, notes)
        print(f"{method}: re-running {len(names)} surviving mutants")
        (work / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)
    if names or not survivors:
        subprocess.run([*mutmut, "run", "--max-children", str(workers), *names], cwd=work, env=env, check=False)
    listing = subprocess.run([*mutmut, "results", "--all", "true"], cwd=work, env=env, check=True,
                             capture_output=True, text=True).stdout
    return write_report(method, parse_results(listing))


def parse_results(listing: str) -> dict[str, str]:
    """``mutant name -> verdict`` from ``mutmut results --all true`` (lines ``    name: verdict``)."""
    verdicts = {}
    for line in listing.splitlines():
        name, sep, verdict = line.strip().rpartition(": ")
        if sep and name:
            verdicts[name] = verdict.strip()
    return verdicts


def survivors_to_rerun(verdicts: dict[str, str], notes: dict[str, tuple[str, str]]) -> list[str]:
    """The mutants ``--survivors`` tests again: those left alive and not excused by an annotation."""
    return sorted(n for n, v in verdicts.items() if v in SURVIVED and n not in notes)


def load_annotations(method: str) -> dict[str, tuple[str, str]]:
    """``mutant name -> (kind, reason)`` for survivors judged equivalent or out of scope."""
    path = ANNOTATIONS / f"{method}.toml"
    if not path.exists():
        return {}
    data = tomllib.loads(path.read_text())
    notes = {}
    for kind in ("equivalent", "out-of-scope"):
        for name, reason in data.get(kind, {}).items():
            if not reason.strip():
                raise ValueError(f"{path}: {name} is marked {kind} without a reason")
            notes[name] = (kind, reason)
    return notes


def summarise(verdicts: dict[str, str], notes: dict[str, tuple[str, str]]) -> dict:
    killed = sorted(n for n, v in verdicts.items() if v in CAUGHT)
    survived = sorted(n for n, v in verdicts.items() if v in SURVIVED)
    excused = {n: notes[n] for n in survived if n in notes}
    open_ = [n for n in survived if n not in excused]
    other = sorted(n for n, v in verdicts.items() if v not in CAUGHT | SURVIVED)
    scored = len(killed) + len(open_) + len(other)  # a mutant no test has judged yet counts as not killed
    return {"killed": killed, "survived": open_, "excused": excused, "other": other,
            "ratio": len(killed) / scored if scored else 1.0,
            "stale_notes": sorted(n for n in notes if n not in verdicts)}


def modules_hash(modules: tuple[str, ...], read=lambda path: (ROOT / path).read_bytes()) -> str:
    """A short sha256 of the target's modules (their paths and contents, in the target's order); a module
    that ``read`` cannot find (moved or deleted) hashes as missing, so a move makes the report stale."""
    digest = hashlib.sha256()
    for path in modules:
        try:
            content = read(path)
        except (FileNotFoundError, subprocess.CalledProcessError):
            content = b"<missing>"
        digest.update(path.encode() + b"\0" + content + b"\0")
    return digest.hexdigest()[:16]


HASH_LINE = re.compile(r"Modules' content hash: `([0-9a-f]+)`")
COMMIT_LINE = re.compile(r"at commit `([0-9a-f]+)`")


def report_hash(method: str) -> str | None:
    """The modules' hash a report was made for: the one it records, or (a report from before reports recorded
    one) the hash of its modules at the commit it names, read from git. None without a report."""
    path = REPORTS / f"{method}.md"
    if not path.exists():
        return None
    text = path.read_text()
    if found := HASH_LINE.search(text):
        return found.group(1)
    commit = COMMIT_LINE.search(text)
    if not commit:
        return None
    show = lambda module: subprocess.run(["git", "show", f"{commit.group(1)}:{module}"], cwd=ROOT,  # noqa: E731
                                         check=True, capture_output=True).stdout
    return modules_hash(TARGETS[method].modules, show)


def stale_reports() -> dict[str, str]:
    """``target -> why`` for every target whose report is missing or was made for other module contents."""
    stale = {}
    for method, target in TARGETS.items():
        made_for = report_hash(method)
        if made_for is None:
            stale[method] = "no report"
        elif made_for != modules_hash(target.modules):
            stale[method] = "its modules changed since the report was made"
    return stale


def known_stale() -> dict[str, str]:
    """The reports tests/mutation/known-stale.toml says are stale (each with why it is not re-run yet)."""
    return dict(tomllib.loads(KNOWN_STALE.read_text()).get("stale", {})) if KNOWN_STALE.exists() else {}


ROW_LINE = re.compile(r"^\| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| ([0-9.]+) \|$", re.M)
MACHINERY = ("stats", "replies", "results", "provenance", "tune", "partitioners", "tables", "checkpoints")


def summary_table() -> str:
    """docs/results/mutation/README.md: every target's counts and kill ratio as its report gives them."""
    lines = ["# Mutation testing: every target", "",
             "Made by `python -m tools.mutation --summary` from the reports beside this page (each made by "
             "`make mutation METHOD=<target>`, mutmut 3). Kill ratio: killed / (killed + survived + not run); "
             "survivors judged equivalent or out of scope (logging and message text) are left out, each with its "
             "reason in the report. `python -m tools.mutation --stale` lists the reports older than their modules, "
             "and tests/mutation/known-stale.toml says why each is not re-run yet.", "",
             "| target | kind | modules | mutants | killed | survived | equivalent | out of scope | not run | "
             "kill ratio | report |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, target in TARGETS.items():
        kind = "machinery" if name in MACHINERY else "method"
        path = REPORTS / f"{name}.md"
        found = ROW_LINE.search(path.read_text()) if path.exists() else None
        cells = " | ".join(found.groups()) if found else "- | - | - | - | - | - | -"
        report = f"[{name}.md]({name}.md)" if found else "no report yet"
        lines.append(f"| {name} | {kind} | {', '.join(f'`{m}`' for m in target.modules)} | {cells} | {report} |")
    return "\n".join(lines) + "\n"


def write_report(method: str, verdicts: dict[str, str]) -> float:
    s = summarise(verdicts, load_annotations(method))
    target = TARGETS[method]
    equivalent = sum(1 for kind, _ in s["excused"].values() if kind == "equivalent")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    lines = [
        f"# Mutation testing: {method}",
        "",
        f"Made by `make mutation METHOD={method}` (`python -m tools.mutation {method}`, mutmut 3) at commit "
        f"`{commit}`. Mutated: {', '.join(f'`{m}`' for m in target.modules)}. Tests run against each mutant: "
        f"{', '.join(f'`{t}`' for t in target.tests)}."
        + (f" Left unmutated (drawing, terminal display, or another target's): "
           f"{', '.join(f'`{f}`' for f in target.skip)}."
           if target.skip else "")
        + (f" Only these functions (and the modules' top-level lines) are mutated: "
           f"{', '.join(f'`{f}`' for f in target.only)}." if target.only else ""),
        "",
        f"Modules' content hash: `{modules_hash(target.modules)}` (`python -m tools.mutation --stale` lists the "
        "reports whose modules changed since).",
        "",
        "| mutants | killed | survived | equivalent | out of scope | not run | kill ratio (killed / (killed + survived + not run)) |",
        "|---|---|---|---|---|---|---|",
        f"| {len(verdicts)} | {len(s['killed'])} | {len(s['survived'])} | {equivalent} | "
        f"{len(s['excused']) - equivalent} | {len(s['other'])} | {s['ratio']:.3f} |",
        "",
    ]
    if s["survived"]:
        lines += ["## Surviving mutants (no test fails)", ""] + [f"- `{n}`" for n in s["survived"]] + [""]
    if s["excused"]:
        lines += ["## Survivors left out of the ratio", "", "| mutant | kind | why |", "|---|---|---|"]
        lines += [f"| `{n}` | {kind} | {reason} |" for n, (kind, reason) in sorted(s["excused"].items())]
        lines += [""]
    if s["other"]:
        lines += ["## Not run (mutmut gave no verdict)", ""]
        lines += [f"- `{n}`: {verdicts[n]}" for n in s["other"]] + [""]
    REPORTS.mkdir(parents=True, exist_ok=True)
    path = REPORTS / f"{method}.md"
    path.write_text("\n".join(lines))
    print(f"{method}: {len(s['killed'])} killed, {len(s['survived'])} survived, {len(s['excused'])} excused, "
          f"ratio {s['ratio']:.3f} -> {path.relative_to(ROOT)}")
    if s["stale_notes"]:
        print(f"note: {len(s['stale_notes'])} annotated mutants no longer exist: {', '.join(s['stale_notes'])}")
    return s["ratio"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("methods", nargs="*", default=list(TARGETS), help=f"any of {', '.join(TARGETS)}")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2,
                        help="mutants tested at once (mutmut's --max-children); 1 on a shared machine")
    parser.add_argument("--fresh", action="store_true", help="forget mutmut's cached verdicts")
    parser.add_argument("--report-only", action="store_true", help="rewrite the report from the last run's verdicts")
    parser.add_argument("--survivors", action="store_true",
                        help="re-run only the last run's unexcused survivors (after adding tests)")
    parser.add_argument("--stale", action="store_true",
                        help="list the reports whose modules changed since they were made, and run nothing")
    parser.add_argument("--summary", action="store_true",
                        help="write docs/results/mutation/README.md, every target's ratio, and run nothing")
    args = parser.parse_args(argv)
    if args.summary:
        (REPORTS / "README.md").write_text(summary_table())
        return 0
    if args.stale:
        for method, why in stale_reports().items():
            print(f"{method}: {why}")
        return 0
    if args.survivors and args.fresh:
        parser.error("--survivors re-runs the last run's survivors; --fresh forgets them")
    unknown = [m for m in args.methods if m not in TARGETS]
    if unknown:
        parser.error(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(TARGETS)}")
    below = []
    for method in args.methods:
        if args.report_only:
            listing = subprocess.run([sys.executable, "-m", "mutmut", "results", "--all", "true"],
                                     cwd=WORK / method, check=True, capture_output=True, text=True).stdout
            ratio = write_report(method, parse_results(listing))
        else:
            ratio = run(method, args.workers, args.fresh, args.survivors)
        if ratio < TARGET_RATIO:
            below.append(f"{method} {ratio:.3f}")
    if below:
        print(f"below the {TARGET_RATIO:.2f} target: {', '.join(below)}")
    return 1 if below else 0


if __name__ == "__main__":
    sys.exit(main())
