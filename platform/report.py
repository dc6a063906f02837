"""Compare evaluated methods on the same episodes: mean ± s.e., paired 95% CI against a reference,
and the optimality gap against a perfect-information bound.

  python platform/report.py runs/best runs/ot16/greedy runs/milp --reference runs/best --bound runs/bound [--out table.md]

Each argument is a directory written by evaluate.py, train.py (its greedy/ or sampled/), milp.py or
bound.py. All must cover the same episodes, horizon and seed; anything else is refused.
"""

import argparse
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from envs.cli import run_cli
from envs.evaluation import paired_comparison, standard_error
from envs.instance import atomic_write_text


def load(directory: str) -> dict:
    path = Path(directory)
    if not (path / "summary.json").is_file() or not (path / "costs.parquet").is_file():
        raise ValueError(f"results directory '{path}': expected summary.json and costs.parquet (a finished evaluation)")
    summary = json.loads((path / "summary.json").read_text())
    costs = pq.read_table(path / "costs.parquet").to_pydict()
    order = np.argsort(costs["episode"])
    return {"name": summary["policy"], "dir": str(path), "summary": summary,
            "episodes": np.asarray(costs["episode"])[order], "cost": np.asarray(costs["discounted_cost"], dtype=np.float64)[order]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="results directories")
    parser.add_argument("--reference", help="results directory of the reference method (default: the first)")
    parser.add_argument("--bound", help="results directory of platform/bound.py, for the optimality gap")
    parser.add_argument("--out", help="also write the table as Markdown to this file")
    args = parser.parse_args()
    runs = [load(d) for d in args.runs]
    reference = load(args.reference) if args.reference else runs[0]
    bound = load(args.bound) if args.bound else None
    for other in runs + [reference] + ([bound] if bound else []):
        key = ("horizon", "seed")
        if any(other["summary"][k] != reference["summary"][k] for k in key) or not np.array_equal(other["episodes"], reference["episodes"]):
            raise ValueError(f"results '{other['dir']}': episodes, horizon or seed differ from the reference '{reference['dir']}'; "
                             "compare only evaluations on the same held-out episodes")
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
