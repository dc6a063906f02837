"""Compare evaluated methods on the same episodes: mean ± s.e., paired 95% CI against a reference,
and the optimality gap against a perfect-information bound.

  python platform/report.py runs/best runs/ot16/greedy runs/milp --reference runs/best --bound runs/bound [--out table.md]

Each argument is a directory written by evaluate.py, train.py (its greedy/ or sampled/), milp.py or
bound.py. All must evaluate the same instance (summary.json records its content hash) on the same
episodes, horizon and seed; anything else is refused, and so is an incomplete or modified folder.
"""

import argparse
from pathlib import Path

import numpy as np

from envs.cli import output_dir, run_cli
from envs.errors import InputError
from envs.evaluation import paired_comparison, standard_error
from envs.instance import atomic_write_text
from envs.results import read_evaluation


def load(directory: str) -> dict:
    run = read_evaluation(directory)
    return {"name": run["summary"]["policy"], "dir": str(directory), **run}


def check_comparable(run: dict, reference: dict) -> None:
    """Paired comparisons need the same instance and the same held-out episodes."""
    a, b = run["summary"], reference["summary"]
    if a["instance_hash"] != b["instance_hash"]:
        raise InputError(f"results '{run['dir']}' (n = {a['n']}, instance {a['instance_hash'][:12]}) and the reference '{reference['dir']}' "
                         f"(n = {b['n']}, instance {b['instance_hash'][:12]}) evaluate different instances; compare only evaluations of one instance")
    if any(a[k] != b[k] for k in ("horizon", "seed")) or not np.array_equal(run["episodes"], reference["episodes"]):
        raise InputError(f"results '{run['dir']}': episodes, horizon or seed differ from the reference '{reference['dir']}'; "
                         "compare only evaluations on the same held-out episodes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="results directories")
    parser.add_argument("--reference", help="results directory of the reference method (default: the first)")
    parser.add_argument("--bound", help="results directory of platform/bound.py, for the optimality gap")
    parser.add_argument("--out", help="also write the table as Markdown to this file")
    args = parser.parse_args()
    if args.out:
        output_dir(Path(args.out).parent, "--out's folder")
        if Path(args.out).is_dir():
            raise InputError(f"--out '{args.out}' is a directory, expected a file name for the Markdown table")
    runs = [load(d) for d in args.runs]
    reference = load(args.reference) if args.reference else runs[0]
    bound = load(args.bound) if args.bound else None
    for other in runs + ([bound] if bound else []):
        check_comparable(other, reference)
    s = reference["summary"]
    lines = [f"{len(reference['episodes'])} episodes x {s['horizon']} steps, seed {s['seed']}; reference: {reference['name']}", "",
             "| method | mean | s.e. | vs reference (95% CI) |" + (" gap to bound |" if bound else ""),
             "| --- | ---: | ---: | --- |" + (" ---: |" if bound else "")]
    for run in runs:
        cmp = paired_comparison(run["cost"], reference["cost"])
        ci = "reference" if run["dir"] == reference["dir"] else f"{cmp.mean_difference:+.2f} [{cmp.ci_low:+.2f}, {cmp.ci_high:+.2f}]"
        gap = f" {100 * (run['cost'].mean() / bound['cost'].mean() - 1):.1f}% |" if bound else ""
        status = run["summary"].get("training", {}).get("status")
        name = run["name"] + (f" ({status})" if status and status != "completed" else "")
        lines.append(f"| {name} | {run['cost'].mean():.2f} | {standard_error(run['cost']):.2f} | {ci} |{gap}")
    if bound:
        lines.append(f"| perfect-information bound | {bound['cost'].mean():.2f} | {standard_error(bound['cost']):.2f} | (lower bound) | 0.0% |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        atomic_write_text(Path(args.out), text + "\n")


if __name__ == "__main__":
    run_cli(main)
