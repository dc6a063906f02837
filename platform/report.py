"""Report on a sweep's results directory, or compare evaluation folders pairwise.

  python platform/report.py RESULTS_DIR [--out RESULTS_DIR/report] [--opening greedy|sampled] [--markdown docs/results.md]
                            [--decision-times [--device cpu|cuda]]
  python platform/report.py EVAL_DIR [EVAL_DIR ...] [--reference EVAL_DIR] [--bound EVAL_DIR] [--out table.md]

A single directory holding sweep.json is a results directory of platform/sweep.py: the report writes
table.md, table.csv, curves.png, curves.svg and index.html (one self-contained page) into --out, and
prints the cost table (conventions: docs/findings.md, "How the report computes its figures"). --decision-times also times
each learned policy's decisions on --device (it loads and runs the first finished seed's policy) against
the MILPs' seconds per decision: a table on the page and decision_time.png. --markdown also writes the
headline, the cost table and the paired comparisons, each under the command that regenerates them (docs/results.md). An existing
report (--out's files, --markdown) is refused unless --overwrite is given.

Otherwise every argument is an evaluation folder written by evaluate.py, train.py (its greedy/ or
sampled/) or milp.py: mean ± s.e., the paired 95% CI against the reference and, with --bound,
the figure of the bound's kind: a perfect-information bound's gap (mean / bound's mean - 1), or the paired
difference to a decomposition bound's relaxed policies with the bound, its DP value, under the table
(policies.decomposition.PAIRED_DIFFERENCE) and a note when it is the equal-shares split or a split the search
did not certify; printed and with --out written as Markdown. A bound's folder is given with --bound, never as a
run or --reference (its mean is no policy's cost). All must evaluate the same instance
(summary.json records its content hash) on the same episodes, horizon and seed; anything else is
refused, and so is an incomplete or modified folder. Folders of platform/backtest.py (summary.json's kind backtest)
are compared with each other only, on the same windows of one history; the table says "backtest on HISTORY".
"""

import argparse
from pathlib import Path

import numpy as np

from cli.output_folders import out_argument, resolve_out
from cli.scripts import count, device, run_cli, script_parser
from envs.evaluation import SE_MIN_VALUES, paired_comparison, standard_error
from plumbing.errors import InputError
from plumbing.files import atomic_write_text
from policies.decomposition import NAME as DECOMPOSITION
from policies.decomposition import (
    PAIRED_DIFFERENCE,
    RELAXED_POLICIES,
    above_text,
    certificate_note,
    dp_figures,
    run_tightest_bound,
    tightest_text,
)
from run_results.records import BACKTEST_KIND, read_evaluation


def load(directory: str) -> dict:
    if (Path(directory) / "sweep.json").is_file():
        raise InputError(f"'{directory}' is a sweep's results directory: report on it alone (python platform/report.py {directory})")
    if Path(directory).is_dir() and not (Path(directory) / "summary.json").exists():
        raise InputError(
            f"'{directory}' holds neither sweep.json (a results directory of platform/sweep.py) nor summary.json (an evaluation "
            "folder; an interrupted evaluation has none)"
        )
    run = read_evaluation(directory)
    return {"name": run["summary"]["policy"], "dir": str(directory), **run}


def load_run(directory: str, flag: str = "") -> dict:
    """An evaluation folder given as a run (or `flag`, --reference): a policy's evaluation; a bound's folder (summary.json's
    kind lower-bound) is refused, since its mean is no policy's cost to pair with one."""
    run = load(directory)
    if run["summary"].get("kind") == "lower-bound":
        raise InputError(
            f"{flag + ' ' if flag else ''}'{directory}' holds a bound ({run['name']}), not a policy's evaluation: give it with --bound"
        )
    return run


def backtest_of(summary: dict) -> str | None:
    """The history a backtest's folder replayed (platform/backtest.py: summary.json's kind backtest), else None."""
    return summary.get("history") if summary.get("kind") == BACKTEST_KIND else None


def check_comparable(run: dict, reference: dict) -> None:
    """Paired comparisons need the same instance and the same held-out episodes, or the same windows of one history."""
    a, b = run["summary"], reference["summary"]
    if (backtest_of(a) is None) != (backtest_of(b) is None):
        backtest, other = (run, reference) if backtest_of(a) is not None else (reference, run)
        raise InputError(
            f"results '{backtest['dir']}' are a backtest on the history {backtest_of(backtest['summary'])!r}, '{other['dir']}' an "
            "evaluation on simulated episodes: their costs are of different episodes; compare backtests with backtests only"
        )
    if a["instance_hash"] != b["instance_hash"]:
        raise InputError(
            f"results '{run['dir']}' (n = {a['n']}, instance {a['instance_hash'][:12]}) and the reference '{reference['dir']}' "
            f"(n = {b['n']}, instance {b['instance_hash'][:12]}) evaluate different instances; compare only evaluations of one instance"
        )
    if backtest_of(a) is not None:
        same_windows = a["horizon"] == b["horizon"] and np.array_equal(run["episodes"], reference["episodes"])
        if a["history_sha256"] != b["history_sha256"] or not same_windows:
            raise InputError(
                f"results '{run['dir']}': a backtest on another history or other windows than the reference '{reference['dir']}' "
                f"({backtest_of(a)!r}, windows of {a['horizon']} against {backtest_of(b)!r}, windows of {b['horizon']}); compare "
                "only backtests of one history with one --window"
            )
        return
    if any(a[k] != b[k] for k in ("horizon", "seed")) or not np.array_equal(run["episodes"], reference["episodes"]):
        raise InputError(
            f"results '{run['dir']}': episodes, horizon or seed differ from the reference '{reference['dir']}'; "
            "compare only evaluations on the same held-out episodes"
        )


def load_bound(directory: str) -> dict:
    """The evaluation folder of --bound: a bound of platform/bound.py (summary.json's kind lower-bound), else refused."""
    bound = load(directory)
    if bound["summary"].get("kind") != "lower-bound":
        raise InputError(
            f"--bound '{directory}' holds the evaluation of the policy {bound['name']!r}, not a bound: give a folder of platform/bound.py "
            "(--kind perfect-information or decomposition)"
        )
    return bound


def se_cell(cost) -> str:
    """The standard error of a run's mean over its episodes, or "none" with one episode (a backtest's one window), where
    no spread exists to estimate it from."""
    return f"{standard_error(cost):.2f}" if cost.size >= SE_MIN_VALUES else "none (one episode)"


def paired_cell(run: dict, other: dict) -> str:
    """The paired difference run - other on the same episodes, with its 95% t-interval (envs.evaluation.paired_comparison);
    with one episode the difference alone."""
    cmp = paired_comparison(run["cost"], other["cost"])
    if cmp.episodes < SE_MIN_VALUES:
        return f"{cmp.mean_difference:+.2f} (no CI: one episode)"
    return f"{cmp.mean_difference:+.2f} [{cmp.ci_low:+.2f}, {cmp.ci_high:+.2f}]"


def bound_notes(summary: dict) -> list[str]:
    """What a decomposition bound's figure is not: the split at equal shares (bound.py's equal-shares/ folder), or a best
    split that the search did not certify (policies.decomposition.certificate_note)."""
    if summary.get("split") == "equal shares":
        return [
            "note: this is the bound at equal shares K/n (bound.py's equal-shares/ folder), not at the best split: a valid but "
            "weaker bound; the best split's is in the folder above it"
        ]
    search = summary.get("search")
    if search and not search["certified"]:
        return [f"note: {certificate_note(search)}: the bound holds, but a better split may exist"]
    return []


def tightest_lines(summary: dict, runs: list[dict]) -> list[str]:
    """The decomposition run's tightest figure (policies.decomposition.tightest_bound) and each run's distance above it; a
    backtest's mean is over the history's windows, not an expected cost from the instance's start: none for those."""
    bound = run_tightest_bound(summary)
    distances = [
        f"{run['name']} {above_text(float(run['cost'].mean()), standard_error(run['cost']), bound['value'])}"
        for run in runs
        if backtest_of(run["summary"]) is None and len(run["cost"]) >= SE_MIN_VALUES
    ]
    above = f"; above it (mean / bound - 1): {'; '.join(distances)}" if distances else ""
    return [f"tightest lower bound: {tightest_text(bound)}{above}"]


def network_note(summary: dict) -> str:
    """Which network of a training run an evaluation is of (trainers.checkpoint.network_of), as the table says it."""
    parameters = summary.get("parameters") or {}
    return f" ({parameters['network']} network, update {parameters['update']})" if "network" in parameters else ""


def pairwise_table(runs: list[dict], reference: dict, bound: dict | None) -> list[str]:
    """The lines of the pairwise table: each run's mean, s.e. and paired difference to the reference, and with a bound
    its figure by the bound's kind. A perfect-information bound is a per-episode bound: its row is the bound, and each
    run's gap is mean / bound's mean - 1. A decomposition bound's per-episode costs are its relaxed policies' (a
    policy of the relaxed problem, not the bound): each run gets the paired difference to them (PAIRED_DIFFERENCE),
    and the bound, its DP value, is written under the table."""
    decomposition = bound is not None and bound["name"].startswith(DECOMPOSITION)
    gap_header = " paired difference to the relaxed policies (95% CI, % of their mean) |" if decomposition else " gap to bound |"
    s = reference["summary"]
    episodes = (
        f"backtest on {backtest_of(s)}: {count(len(reference['episodes']), 'window')} x {s['horizon']} periods of the history "
        "(not the held-out set)"
        if backtest_of(s) is not None
        else f"{count(len(reference['episodes']), 'episode')} x {s['horizon']} steps, seed {s['seed']}"
    )
    lines = [
        f"{episodes}; reference: {reference['name']}",
        "",
        "| method | mean | s.e. | vs reference (95% CI) |" + (gap_header if bound else ""),
        "| --- | ---: | ---: | --- |" + ((" --- |" if decomposition else " ---: |") if bound else ""),
    ]
    for run in runs:
        ci = "reference" if run["dir"] == reference["dir"] else paired_cell(run, reference)
        if decomposition:
            share = paired_comparison(run["cost"], bound["cost"]).mean_difference / bound["cost"].mean()
            gap = f" {paired_cell(run, bound)} ({100 * share:.1f}%) |"
        else:
            gap = f" {100 * (run['cost'].mean() / bound['cost'].mean() - 1):.1f}% |" if bound else ""
        status = run["summary"].get("training", {}).get("status")
        name = run["name"] + (f" ({status})" if status and status != "completed" else "") + network_note(run["summary"])
        lines.append(f"| {name} | {run['cost'].mean():.2f} | {se_cell(run['cost'])} | {ci} |{gap}")
    if decomposition:
        b = bound["summary"]
        lines += [
            f"| {RELAXED_POLICIES} (simulated) | {bound['cost'].mean():.2f} | {se_cell(bound['cost'])} | "
            f"{paired_cell(bound, reference)} | 0 |",
            "",
            f"decomposition bound: {dp_figures(b['dp_value'], b['conservative_value'])} (an expected cost: the bound)",
            *bound_notes(b),
            *tightest_lines(b, runs),
            "",
            PAIRED_DIFFERENCE,
        ]
    elif bound:
        lines.append(f"| perfect-information bound | {bound['cost'].mean():.2f} | {se_cell(bound['cost'])} | (lower bound) | 0.0% |")
    return lines


def sweep_report(args: argparse.Namespace) -> None:
    from sweeps.render import REPORT_FILES, cost_table, markdown, write_report
    from sweeps.report import build_report, time_decisions

    root = args.runs[0]
    given = [flag for flag in ("reference", "bound") if getattr(args, flag)]
    if given:
        raise InputError(f"--{given[0]} compares evaluation folders; '{root}' is a sweep's results directory, reported on alone")
    if args.device and not args.decision_times:
        raise InputError("--device is the device of --decision-times: give it with --decision-times, or leave it out")
    out = resolve_out(args.out or Path(root) / "report")
    if (held := [name for name in REPORT_FILES if (out / name).exists()]) and not args.overwrite:
        raise InputError(f"--out '{out}' holds a report ({', '.join(held)}): give --overwrite to replace it, or another --out")
    if args.markdown:
        resolve_out(args.markdown, "--markdown", is_file=True, overwrite=args.overwrite)
    report = build_report(root, args.opening or "greedy")
    if args.decision_times:
        time_decisions(report, args.device or "cpu")
    command = " ".join(
        [
            "python platform/report.py",
            root,
            "--out",
            str(out),
            *(["--opening", args.opening] if args.opening else []),
            *(["--markdown", args.markdown] if args.markdown else []),
            *(["--decision-times"] if args.decision_times else []),
            *(["--device", args.device] if args.device else []),
            *(["--overwrite"] if args.overwrite else []),
        ]
    )
    written = write_report(report, out, args.markdown, command)
    print(markdown(cost_table(report)))
    print(f"report: {written['index.html']}")


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("runs", nargs="+", help="a sweep's results directory, or evaluation folders")
    parser.add_argument(
        "--out",
        type=out_argument,
        help="a sweep's results directory: the report's folder (default RESULTS_DIR/report); "
        "evaluation folders: also write the table as Markdown to this file",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing report: --out's files and --markdown")
    sweep = parser.add_argument_group("a sweep's results directory")
    sweep.add_argument("--opening", choices=("greedy", "sampled"), help="the learned policies' evaluation to report (default greedy)")
    sweep.add_argument(
        "--markdown", type=out_argument, help="also write the headline, cost table and paired comparisons as Markdown (docs/results.md)"
    )
    sweep.add_argument(
        "--decision-times",
        action="store_true",
        help="also time each learned policy's decisions (one state and the held-out batch) against the MILPs' seconds per decision",
    )
    sweep.add_argument("--device", type=device, help="device of --decision-times (default cpu)")
    pairwise = parser.add_argument_group("evaluation folders")
    pairwise.add_argument("--reference", help="evaluation folder of the reference method (default: the first)")
    pairwise.add_argument("--bound", help="evaluation folder of platform/bound.py, for the optimality gap")
    args = parser.parse_args()
    if len(args.runs) == 1 and (Path(args.runs[0]) / "sweep.json").is_file():
        return sweep_report(args)
    given = [flag for flag in ("opening", "markdown", "decision_times", "device") if getattr(args, flag)]
    if given:
        raise InputError(f"--{given[0].replace('_', '-')} needs a sweep's results directory (a directory holding sweep.json), given alone")
    seen: dict[Path, int] = {}
    for k, folder in enumerate(args.runs):
        if (first := seen.setdefault(Path(folder).resolve(), k)) != k:
            raise InputError(f"EVAL_DIR {k + 1} '{folder}' is EVAL_DIR {first + 1} again: give each evaluation folder once")
    if args.out:
        folders = {"--reference": args.reference, "--bound": args.bound, **{f"EVAL_DIR {k + 1}": d for k, d in enumerate(args.runs)}}
        resolve_out(args.out, is_file=True, overwrite=args.overwrite, folders=folders)
    runs = [load_run(d) for d in args.runs]
    reference = load_run(args.reference, "--reference") if args.reference else runs[0]
    bound = load_bound(args.bound) if args.bound else None
    for other in runs + ([bound] if bound else []):
        check_comparable(other, reference)
    text = "\n".join(pairwise_table(runs, reference, bound))
    print(text)
    if args.out:
        atomic_write_text(Path(args.out), text + "\n")


if __name__ == "__main__":
    run_cli(main)
