"""Backtest policies on a demand history: each decides period by period on the actual demand (docs/fitting.md#backtest).

  python platform/backtest.py --history demand.csv --instance inst.json --policy classical-best --policy zero --out runs/bt

--history is read as platform/fit.py reads it (item, period, demand); --instance is typically the one fit.py wrote
from a history (its items are matched by name where it names them, else by count, in the history's order). POLICY is
one of: {rules}, dp-optimal, decomposition-lookahead, decomposition-lookahead:DIR, checkpoint:PATH or user-rule:PATH, as for
evaluate.py; --policy may be given several times. Classical families and the lookahead's threshold are tuned on
training paths of the instance for --window steps; the lookahead uses its stationary tables unless --lookahead-form
says finite (a backtest's windows cut an unending history, so no horizon is known to the policy).

The history's periods are cut into consecutive windows of --window periods (the last T mod W are not replayed); a
window must let an order arrive (--window at least the instance's shortest lead time + 1) and the history must hold
one; a history whose period length differs from the one the instance was fitted on (source.step) is refused. Each
window is one episode through the simulator's dynamics with the instance's costs (h, b, K, lead times, gamma
discounting), from the simulator's initial state (I_0 = mu_i = lam_i (L_i + 1), nothing in transit), scored by its
discounted cost. The factor in the policy's state is E[F_t | demand before t] under the instance's demand model
(a causal filter, demand/factor_filter.py: exact on a grid for one factor, a Gaussian approximation for k >= 2),
never the smoothed path of the fit report, which sees the future. A checkpoint's network takes one factor only: on
an instance with k >= 2 it is refused in one line before anything is tuned or replayed.

A history with an `ordered` column (the units the user ordered of each item in each period) is also replayed as it
ran: its orders, placed as recorded in each window from the same initial state, scored like a policy under the name
as-run (folder as-run) and paired with every policy over the same windows.

Writes under --out one evaluation folder per policy (summary.json with kind "backtest" and policy
"backtest:<method>", costs.parquet with one row per window; platform/report.py reads them) and backtest.json: every
policy's mean and the paired comparison of every two policies over the same windows (mean difference, s.e., 95%
t-interval), also printed; with one window there is no s.e. nor interval (null in backtest.json, "no s.e." printed). An
--out that holds a run is refused, --overwrite replaces it; one inside an input folder or another run's folder is
refused.
"""

import argparse
import json
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cli.output_folders import out_argument, resolve_out
from cli.scripts import count, device, learned_policy_flags, positive_int, run_cli, script_parser
from demand.factor_filter import causal_factor, describe_filter
from demand.sales_history import History, history_matrix
from envs.evaluation import EVAL_HORIZON, Evaluation
from envs.exogenous import check_cost_range
from envs.history_replay import check_window, paired_comparisons, recorded_orders, replay, window_count, window_se
from envs.instance import Instance, item_rows
from plumbing.errors import InputError
from plumbing.files import atomic_write_text
from policies.classical import POLICY_NAMES
from policies.lookahead import FORMS
from policies.lookahead import NAME as LOOKAHEAD
from policies.names import TABLES_PREFIX, named_label, policy_spec
from run_results.records import (
    BACKTEST,
    BACKTEST_FILE,
    BACKTEST_FORMAT,
    BACKTEST_KIND,
    EVALUATION,
    check_run_folder,
    clear_run,
    write_evaluation,
)
from trainers.resolver import ResolvedPolicy, resolve

VERSION = 1
AS_RUN = "as-run"
"""The name, label and folder of the history's own orders replayed (its `ordered` column)."""
INITIAL_STATE = "the simulator's initial state: I_0 = mu_i = lam_i (L_i + 1), nothing in transit, the filtered factor"


def history_columns(history: History, instance: Instance, history_path: str, instance_path: str) -> np.ndarray:
    """The history's column of each of the instance's items (envs.instance.item_rows): by name where the instance names
    its items (source.item_names, written by fit.py), else by count in the history's order; any other history is refused."""
    by_count = "the history's items are matched by count, in their order of first appearance"
    return item_rows(instance, history.items, f"history '{history_path}'", f" '{instance_path}'", by_count, "demand")


def check_step(history: History, instance: Instance, history_path: str, instance_path: str) -> None:
    """Refuse a history whose period length (History.step) is not the one the instance was fitted on (source.step,
    written by platform/fit.py): the instance's rates lam_i are demand per period of that length. An instance that
    records no step (one not fitted by fit.py) cannot be checked: that is said in one line, with the period length
    the history's periods are taken for."""
    fitted = (instance.source or {}).get("step")
    if fitted is None:
        print(
            f"note: the instance '{instance_path}' records no period length (source.step: it was not fitted by fit.py), so "
            f"its demand rates are taken as per period of the history '{history_path}', {history.step}",
            flush=True,
        )
    elif fitted != history.step:
        raise InputError(
            f"history '{history_path}' has periods of {history.step}, while the instance '{instance_path}' was fitted on periods "
            f"of {fitted} (source.step), so its demand rates are per {fitted}: backtest a history of periods of {fitted}, or "
            "fit an instance on this history's periods"
        )


def folder_name(label: str, taken: set[str]) -> str:
    """A policy's folder under --out: its method label, with -2, -3, ... after a label already taken (two checkpoints of
    one method)."""
    return next(name for name in (label, *(f"{label}-{j}" for j in range(2, len(taken) + 3))) if name not in taken)


def previous_folders(out: Path) -> list[Path]:
    """The policy folders that the backtest held in `out` lists (its backtest.json), if any."""
    try:
        record = json.loads((out / BACKTEST_FILE).read_text(encoding="utf-8"))
        return [out / entry["folder"] for entry in record["policies"] if Path(entry["folder"]).name == entry["folder"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


@dataclass
class Backtest:
    """A backtest's checked inputs: options, --out, instance, history and its demand [T, n] in the instance's item order, windows, form."""

    args: argparse.Namespace
    out: Path
    instance: Instance
    history: History
    demand: np.ndarray
    ordered: np.ndarray | None
    windows: int
    form: str


def parse_args() -> argparse.Namespace:
    """The options; refuses a policy named twice, and --lookahead-form or --mode when no --policy takes it."""
    rules = textwrap.fill(", ".join(POLICY_NAMES), 100, initial_indent=" " * 10, break_on_hyphens=False).strip()
    parser = script_parser(__doc__.format(rules=rules))
    parser.add_argument("--history", required=True, help="CSV or Parquet demand history: item, period, demand (as fit.py reads it)")
    parser.add_argument("--instance", required=True, help="instance JSON file (e.g. the one fit.py wrote from a history)")
    parser.add_argument(
        "--policy", required=True, action="append", type=policy_spec, metavar="POLICY", help="policy name (see above); repeat for several"
    )
    parser.add_argument("--window", type=positive_int, default=EVAL_HORIZON, help=f"periods per window (episode) (default {EVAL_HORIZON})")
    learned_policy_flags(parser, "checkpoint:PATH")
    parser.add_argument(
        "--lookahead-form", choices=FORMS, help="for decomposition-lookahead: stationary tables (default) or finite ones for --window"
    )
    parser.add_argument("--trace", action="store_true", help="also write steps.parquet and items.parquet per policy")
    parser.add_argument("--device", default="cpu", type=device, help="torch device: cpu, cuda or cuda:K (default cpu)")
    parser.add_argument("--out", type=out_argument, required=True, help="output directory: one folder per policy and backtest.json")
    parser.add_argument("--overwrite", action="store_true", help="replace a run that --out holds instead of refusing it")
    args = parser.parse_args()
    if len(set(args.policy)) < len(args.policy):
        repeated = next(name for name in args.policy if args.policy.count(name) > 1)
        parser.error(f"--policy {repeated}: given twice; name each policy once")
    if args.lookahead_form is not None and not any(spec.lookahead for spec in args.policy):
        parser.error(f"--lookahead-form: applies to {LOOKAHEAD} and {TABLES_PREFIX}DIR only, and no --policy names one")
    if args.mode != "greedy" and not any(spec.learned for spec in args.policy):
        parser.error(f"--mode {args.mode}: applies to checkpoint:PATH only, and no --policy names one")
    return args


def read_inputs(args: argparse.Namespace) -> Backtest:
    """--out, the instance and the history, each checked (the output folder first, then the inputs against --window and each other)."""
    policy_paths = {f"--policy {spec}": spec.path for spec in args.policy}
    # the tables folders a lookahead reads (a checkpoint's folder is a run's: refused as one)
    tables = {f"--policy {spec}": spec.path for spec in args.policy if spec.lookahead}
    out = resolve_out(args.out, inputs={"--history": args.history, "--instance": args.instance} | policy_paths, folders=tables)
    check_run_folder(out, BACKTEST, overwrite=args.overwrite, resumable=False)
    instance = Instance.load(args.instance)
    check_window(args.window, instance.lead, args.instance)
    history = history_matrix(args.history)
    check_step(history, instance, args.history, args.instance)
    columns = history_columns(history, instance, args.history, args.instance)
    demand, ordered = history.demand[:, columns], None if history.ordered is None else history.ordered[:, columns]
    windows = window_count(demand.shape[0], args.window, f"the history '{args.history}'")
    check_cost_range(instance, args.window)
    if ordered is not None:
        check_run_folder(out / AS_RUN, EVALUATION, overwrite=args.overwrite, resumable=False)
    return Backtest(args, out, instance, history, demand, ordered, windows, args.lookahead_form or FORMS[1])


def resolve_policies(backtest: Backtest) -> tuple[dict[int, ResolvedPolicy], dict[int, str]]:
    """Each policy (by its index in --policy) resolved, and its folder under --out, every folder checked before any tuning."""
    args, form = backtest.args, backtest.form
    resolved = {  # checkpoints first: they load in seconds, and their labels name their folders
        k: resolve(name, backtest.instance, args.window, args.mode, form, args.device, progress=True, precision=args.precision)
        for k, name in enumerate(args.policy)
        if name.learned
    }
    folders = {}
    for k, name in enumerate(args.policy):
        folders[k] = folder_name(resolved[k].label if k in resolved else named_label(name, form), set(folders.values()))
        check_run_folder(backtest.out / folders[k], EVALUATION, overwrite=args.overwrite, resumable=False)  # before any tuning
    for k, name in enumerate(args.policy):
        if k not in resolved:
            resolved[k] = resolve(name, backtest.instance, args.window, "greedy", form, args.device, progress=True)
    return resolved, folders


@dataclass(frozen=True)
class Replayed:
    """One replay of the history's windows: the name it was asked by, its method label, its parameters, its folder
    under --out and its costs."""

    name: str
    label: str
    parameters: dict
    folder: str
    result: Evaluation


def replay_policies(backtest: Backtest, resolved: dict[int, ResolvedPolicy], folders: dict[int, str]) -> list[Replayed]:
    """Each policy's replay of the history's windows, on the causally filtered factor, in --policy's order; then the
    history's own orders (as-run) where it records them."""
    args = backtest.args
    factor = causal_factor(backtest.instance, backtest.demand)  # [T + 1] (or [T + 1, k]) E[F_t | D_<t]
    tensors = backtest.instance.to_torch(args.device)
    replayed = [
        Replayed(
            spec.name,
            resolved[k].label,
            resolved[k].parameters,
            folders[k],
            replay(resolved[k].policy, tensors, backtest.demand, factor, args.window, args.trace, f"backtest {folders[k]}"),
        )
        for k, spec in enumerate(args.policy)
    ]
    if backtest.ordered is not None:
        orders = recorded_orders(backtest.ordered, args.window, tensors.device)
        result = replay(orders, tensors, backtest.demand, factor, args.window, args.trace, f"backtest {AS_RUN}")
        above = int((backtest.ordered > backtest.instance.qbar).sum())
        replayed.append(Replayed(AS_RUN, AS_RUN, {"orders": "the history's ordered column", "orders_above_qbar": above}, AS_RUN, result))
    return replayed


def clear_previous(out: Path, folders: list[str]) -> None:
    """The run that --out holds removed (--overwrite): the folders its backtest.json lists, this backtest's folders, then its own files."""
    for folder in previous_folders(out):
        clear_run(folder)
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    for name in folders:  # a folder of this backtest that holds a run of another kind
        clear_run(out / name)
    clear_run(out)


def backtest_fields(backtest: Backtest) -> dict:
    """The fields every policy's summary.json adds: the history, its windows, the initial state and the factor's filter."""
    args, history, demand, windows = backtest.args, backtest.history, backtest.demand, backtest.windows
    return {
        "kind": BACKTEST_KIND,
        "history": str(args.history),
        "history_sha256": history.sha256,
        "in_sample": (backtest.instance.source or {}).get("history_sha256") == history.sha256,
        "periods": demand.shape[0],
        "periods_replayed": windows * args.window,
        "window": args.window,
        "window_starts": [history.periods[w * args.window] for w in range(windows)],
        "step": history.step,
        "initial_state": INITIAL_STATE,
        "factor": f"causal filter E[F_t | D_0..D_(t-1)] (demand/factor_filter.py: {describe_filter(backtest.instance)})",
    }


def write_policies(backtest: Backtest, extra: dict, replayed: list[Replayed]) -> tuple[list[dict], dict[str, np.ndarray]]:
    """Each policy's evaluation folder written and its mean printed; returns backtest.json's policy rows and each folder's window costs."""
    args, out, instance, windows = backtest.args, backtest.out, backtest.instance, backtest.windows
    lookahead = any(spec.lookahead for spec in args.policy)
    config = {
        **vars(args),
        "policy": [spec.name for spec in args.policy],
        "lookahead_form": backtest.form if lookahead else None,
        "n": instance.n,
    }
    costs, rows = {}, []
    for run in replayed:
        label = f"{BACKTEST_KIND}:{run.label}"
        summary = write_evaluation(out / run.folder, label, run.result, 0, config, run.parameters, extra, instance=instance)
        costs[run.folder] = run.result.discounted_cost
        se = window_se(summary["se"], windows)
        rows.append({"policy": run.name, "folder": run.folder, "mean": summary["mean"], "se": se})
        spread = f"± {se:.2f} (s.e.)" if se is not None else "(no s.e.: one window)"
        where = f"over {count(windows, 'window')} of {args.window} periods -> {out / run.folder}"
        print(f"{summary['policy']}: mean {summary['mean']:.2f} {spread} {where}")
    return rows, costs


def print_comparisons(comparisons: list[dict]) -> None:
    """One line per paired comparison: the mean difference, with its s.e. and 95% CI where there are two windows or more."""
    for row in comparisons:
        spread = (
            f"± {row['se']:.2f} (s.e.), 95% CI [{row['ci_low']:+.2f}, {row['ci_high']:+.2f}]"
            if row["se"] is not None
            else "(no s.e. or CI: one window)"
        )
        print(f"{row['a']} - {row['b']}: {row['mean_difference']:+.2f} {spread} over the same {count(row['windows'], 'window')}")


def write_record(backtest: Backtest, extra: dict, rows: list[dict], comparisons: list[dict]) -> None:
    """backtest.json written under --out, then one line saying what was replayed and where it went."""
    args, history, windows = backtest.args, backtest.history, backtest.windows
    record = {
        "format": BACKTEST_FORMAT,
        "version": VERSION,
        **{key: extra[key] for key in ("history", "history_sha256", "in_sample", "periods", "periods_replayed", "window", "step")},
        "windows": windows,
        "instance": str(args.instance),
        "instance_hash": backtest.instance.content_hash(),
        "policies": rows,
        "comparisons": comparisons,
    }
    atomic_write_text(backtest.out / BACKTEST_FILE, json.dumps(record, indent=1) + "\n")
    unused = backtest.demand.shape[0] - windows * args.window
    print(
        f"backtest on {args.history}: {count(windows, 'window')} x {args.window} periods from {history.periods[0]}"
        + ("; one window has no standard error: give a shorter --window" if windows == 1 else "")
        + (f"; the last {unused} periods, fewer than a window, not replayed" if unused else "")
        + ("; in-sample: the instance was fitted on this history" if extra["in_sample"] else "")
        + f" -> {backtest.out / BACKTEST_FILE}"
    )


def main() -> None:
    backtest = read_inputs(parse_args())
    resolved, folders = resolve_policies(backtest)
    replayed = replay_policies(backtest, resolved, folders)
    if backtest.args.overwrite:
        clear_previous(backtest.out, [run.folder for run in replayed])
    extra = backtest_fields(backtest)
    rows, costs = write_policies(backtest, extra, replayed)
    comparisons = paired_comparisons(costs)
    print_comparisons(comparisons)
    write_record(backtest, extra, rows, comparisons)


if __name__ == "__main__":
    run_cli(main)
