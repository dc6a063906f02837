"""A catalogue from history to page (platform/recommend.py; docs/fitting.md, "A catalogue in one command").

One fit of the demand model over every item (the common factors are shared), then, per supplier, as one Ray task:
the decomposition bound with its certificate (policies/decomposition.py, its per-item work in the task's process), on
the held-out episodes classical-best, the decomposition lookahead on the bound's tables and the user's rule, and on the
history itself the backtest of the three and of the user's recorded orders (as-run), paired over the same windows. A
supplier's folder is written under a temporary name and renamed when whole, so it is whole or not there; a re-run keeps
every whole folder of the same inputs and settings (the bound's journal also keeps a killed task's finished items).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from catalogue.folders import (
    AS_RUN,
    ATTEMPTS,
    BACKTEST,
    BOUND,
    FIT,
    FORMAT,
    HELD_OUT,
    MANIFEST,
    PROGRESS,
    RULES,
    SUPPLIER_RECORD,
    SUPPLIERS,
    folder_name,
    partial_folder,
    recommended_spec,
)
from envs.evaluation import EVAL_HORIZON, evaluate, paired_comparison, standard_error
from envs.exogenous import HELDOUT_EPISODES, HELDOUT_SEED, VALIDATION_SEED, sample_paths
from envs.history_replay import check_window, paired_comparisons, recorded_orders, replay, window_count, window_se
from envs.instance import Instance
from plumbing.files import atomic_write_text
from policies.classical import CLASSICAL_BEST
from policies.decomposition import DecompositionOptions, above_bound, run_tightest_bound
from policies.lookahead import FORMS
from policies.names import PolicySpec, named_label, parse_policy, tables_spec
from policies.user_rule import NAME as USER_RULE
from run_results.records import write_evaluation


@dataclass(frozen=True)
class CatalogueOptions:
    """The settings every supplier's work shares (recorded, and compared on a re-run): held-out `episodes` of `horizon`
    decisions from `seed`, backtest windows of `window` periods."""

    episodes: int = HELDOUT_EPISODES
    horizon: int = EVAL_HORIZON
    seed: int = HELDOUT_SEED
    window: int = EVAL_HORIZON


@dataclass(frozen=True)
class SupplierInputs:
    """One supplier's share of the catalogue: its instance (items named), the history's demand and orders of its items
    [T, n] (orders None without an ordered column), and the user's rule table (None without one)."""

    name: str
    instance: Instance
    demand: np.ndarray
    ordered: np.ndarray | None
    rules: str | None


def candidates(supplier: SupplierInputs, bound: Path) -> list[PolicySpec]:
    """The policies a supplier's page compares: classical-best, the lookahead on the bound's tables, the user's rule."""
    found = [parse_policy(CLASSICAL_BEST), tables_spec(bound)]
    return found + ([parse_policy(f"{USER_RULE}:{supplier.rules}")] if supplier.rules else [])


def held_out(supplier: SupplierInputs, folder: Path, bound: Path, options: CatalogueOptions) -> dict[str, dict]:
    """Each candidate's expected cost on the held-out episodes (its evaluation folder under held-out/), and its mean on
    as many validation episodes (envs.exogenous.VALIDATION_SEED), on which the recommendation is chosen: the held-out
    figures the page reports are then not those it was chosen by."""
    from trainers.resolver import resolve

    instance = supplier.instance
    paths = sample_paths(instance, options.seed, options.episodes, options.horizon)
    validation = sample_paths(instance, VALIDATION_SEED, options.episodes, options.horizon)
    figures = {}
    for spec in candidates(supplier, bound):
        resolved = resolve(spec, instance, options.horizon, form=FORMS[0])
        result = evaluate(resolved.policy, instance.to_torch(), paths)
        label = named_label(spec)
        config = {"catalogue": True, "supplier": supplier.name, "policy": spec.name, **asdict(options)}
        summary = write_evaluation(folder / HELD_OUT / label, label, result, options.seed, config, resolved.parameters, instance=instance)
        chosen_by = float(evaluate(resolved.policy, instance.to_torch(), validation).mean)
        figures[label] = {"mean": summary["mean"], "se": summary["se"], "validation_mean": chosen_by, "costs": result.discounted_cost}
    return figures


def backtest(supplier: SupplierInputs, folder: Path, bound: Path, options: CatalogueOptions) -> dict[str, Any]:
    """The candidates and the recorded orders on the supplier's history, window by window (envs/history_replay.py), from
    the causal factor filter; each run's folder under backtest/, and every pair's paired comparison."""
    from demand.factor_filter import causal_factor
    from trainers.resolver import resolve

    instance = supplier.instance
    windows = window_count(supplier.demand.shape[0], options.window, f"the history of supplier '{supplier.name}'")
    factor = causal_factor(instance, supplier.demand)
    tensors = instance.to_torch()
    runs = {}
    for spec in candidates(supplier, bound):
        resolved = resolve(spec, instance, options.window, form=FORMS[1])
        runs[named_label(spec)] = (replay(resolved.policy, tensors, supplier.demand, factor, options.window), resolved.parameters)
    if supplier.ordered is not None:
        runs[AS_RUN] = (replay(recorded_orders(supplier.ordered, options.window), tensors, supplier.demand, factor, options.window), {})
    means = {}
    for label, (result, parameters) in runs.items():
        config = {"catalogue": True, "supplier": supplier.name, "window": options.window, "windows": windows}
        summary = write_evaluation(
            folder / BACKTEST / label, f"backtest:{label}", result, 0, config, parameters, {"kind": "backtest"}, instance=instance
        )
        means[label] = {"mean": summary["mean"], "se": window_se(summary["se"], windows)}
    return {
        "windows": windows,
        "window": options.window,
        "means": means,
        "comparisons": paired_comparisons({k: r.discounted_cost for k, (r, _) in runs.items()}),
    }


def run_supplier(supplier: SupplierInputs, folder: Path, options: CatalogueOptions) -> dict[str, Any]:
    """Everything for one supplier (module docstring) in `folder`.partial, renamed to `folder` when whole; returns its
    record (supplier.json), which holds the per-episode held-out costs the catalogue's total pairs."""
    from policies.decomposition import NAME as DECOMPOSITION
    from solver_workers.pool import InProcessPool
    from solver_workers.solver_run import SolverRun, decomposition_journal, run_decomposition_bound

    started = time.perf_counter()
    partial = partial_folder(folder)
    partial.mkdir(parents=True, exist_ok=True)
    attempts = start_attempt(partial / ATTEMPTS)
    report = StageReport(partial / PROGRESS)
    instance = supplier.instance
    instance.save(partial / "instance.json")
    bound_dir = partial / BOUND
    run = SolverRun(bound_dir, options.seed, options.episodes, options.horizon, 1, config={"catalogue": True, "supplier": supplier.name})
    decomposition = DecompositionOptions()
    report("bound")
    pool = InProcessPool(progress=False, report=lambda desc, done, total: report(f"bound, {desc}", done, total))
    bound = run_decomposition_bound(run, instance, decomposition_journal(run, instance, decomposition), decomposition, pool)
    tightest = run_tightest_bound(bound)
    report("held-out")
    figures = held_out(supplier, partial, bound_dir, options)
    for figure in figures.values():
        figure["above_bound"], figure["above_bound_95"] = above_bound(figure["mean"], figure["se"], tightest["value"])
    recommended = min(figures, key=lambda label: figures[label]["validation_mean"])
    record = {
        "supplier": supplier.name,
        "rules": supplier.rules,
        "n": instance.n,
        "K": instance.K,
        "items": instance.item_names,
        "instance_hash": instance.content_hash(),
        "bound": {"name": DECOMPOSITION, "tightest": tightest, "certified_value": bound["certified_value"], "dp_value": bound["dp_value"]},
        "held_out": {label: {k: v for k, v in f.items() if k != "costs"} for label, f in figures.items()},
        "held_out_costs": {label: f["costs"].tolist() for label, f in figures.items()},
        "recommended": recommended,
    }
    report("backtest")
    record |= {"backtest": backtest(supplier, partial, bound_dir, options), "attempts": attempts}
    record["seconds"] = time.perf_counter() - started
    (partial / PROGRESS).unlink(missing_ok=True)
    atomic_write_text(partial / SUPPLIER_RECORD, json.dumps(record, indent=1) + "\n")
    if folder.exists():
        shutil.rmtree(folder)
    partial.rename(folder)
    return record


class StageReport:
    """A running supplier's stage for the driver's bar (`PROGRESS` in its `.partial` folder; `running_stages` reads it):
    written when the stage changes, and within one (the bound's tasks: done of total) at most once a second and at its end."""

    def __init__(self, path: Path, clock=time.monotonic):
        self.path, self.clock = path, clock
        self.last: tuple[str | None, float] = (None, -math.inf)

    def __call__(self, stage: str, done: int = 0, total: int = 0) -> None:
        now = self.clock()
        if stage == self.last[0] and now - self.last[1] < 1.0 and done < total:
            return
        self.last = (stage, now)
        atomic_write_text(self.path, json.dumps({"stage": stage, "done": done, "total": total}) + "\n")


def running_stages(folders: list[Path], shown: int = 3) -> str:
    """The stages of the suppliers whose folders are `folders` and that are running (a `PROGRESS` in their `.partial`
    folder), as the suppliers bar's postfix: 'north: bound, items 12/55; south: held-out', the first `shown` of them."""
    stages = []
    for folder in folders:
        try:
            progress = json.loads((partial_folder(folder) / PROGRESS).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        count = f" {progress['done']}/{progress['total']}" if progress.get("total") else ""
        stages.append(f"{folder.name}: {progress['stage']}{count}")
    more = f"; {len(stages) - shown} more" if len(stages) > shown else ""
    return "; ".join(stages[:shown]) + more


def start_attempt(path: Path) -> list[dict[str, Any]]:
    """Append this task's start to a supplier's attempts (`ATTEMPTS`: a line per start, where a lost node's attempt left
    its own) and return them all: the attempt's number, time and the node and process it runs in."""
    from datetime import UTC, datetime

    from ray_access.session import this_node

    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    earlier = [json.loads(line) for line in lines if line.endswith("}")]  # a line a killed process cut short is left out
    attempt = {"attempt": len(earlier) + 1, "time": datetime.now(UTC).isoformat(timespec="seconds"), **this_node()}
    with open(path, "a", encoding="utf-8") as stream:
        stream.write(json.dumps(attempt) + "\n")
        stream.flush()
        os.fsync(stream.fileno())
    return [*earlier, attempt]


def read_record(folder: Path, instance: Instance) -> dict | None:
    """A supplier's record where its folder is whole and of this instance (the same items, costs and model), else None."""
    try:
        record = json.loads((folder / SUPPLIER_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("instance_hash") == instance.content_hash() else None


def catalogue_total(records: list[dict]) -> dict[str, Any]:
    """The catalogue's expected discounted cost per episode under each supplier's recommendation: the suppliers'
    held-out episodes share the factor paths (one seed, the same episodes), so a catalogue episode's cost is the sum of
    its suppliers' and its mean and s.e. are taken over those sums; with the tightest bounds' sum beside it."""
    costs = np.sum([np.asarray(r["held_out_costs"][r["recommended"]]) for r in records], axis=0)
    bound = float(sum(r["bound"]["tightest"]["value"] for r in records))
    mean = float(costs.mean())
    se = standard_error(costs)
    above, above95 = above_bound(mean, se, bound)
    return {"mean": mean, "se": se, "bound": bound, "above_bound": above, "above_bound_95": above95, "episodes": int(costs.size)}


def paired_total(records: list[dict], reference: str) -> dict | None:
    """The catalogue's total paired against the user's rule on the held-out episodes (recommended minus user-rule, summed
    over suppliers per episode), where every supplier has the user's rule."""
    if not all(USER_RULE in r["held_out_costs"] for r in records):
        return None
    ours = np.sum([np.asarray(r["held_out_costs"][r["recommended"]]) for r in records], axis=0)
    theirs = np.sum([np.asarray(r["held_out_costs"][reference]) for r in records], axis=0)
    cmp = paired_comparison(ours, theirs)
    return {"mean_difference": cmp.mean_difference, "se": cmp.se, "ci": [cmp.ci_low, cmp.ci_high], "episodes": cmp.episodes}


def check_supplier_window(supplier: SupplierInputs, options: CatalogueOptions) -> None:
    """Refuse, before anything runs, a backtest window that no order of the supplier's items can arrive within, or
    longer than the history."""
    check_window(options.window, supplier.instance.lead, f"supplier '{supplier.name}'")
    window_count(supplier.demand.shape[0], options.window, f"the history of supplier '{supplier.name}'")


@dataclass(frozen=True)
class CatalogueInputs:
    """The files a catalogue is made from, and the supplier the items without one join (None: they are refused)."""

    history: str
    costs: str
    suppliers: str
    rules: str | None = None
    unassigned: str | None = None


def read_inputs(inputs: CatalogueInputs):
    """Every input checked before anything runs: the cost table (with its supplier column), the supplier table, each
    item's supplier, the history (its items those of the cost table) and the rule table (a rule for every item, no
    other). Returns (costs, suppliers, each item's supplier, history)."""
    from catalogue.suppliers import item_suppliers, read_suppliers
    from demand.sales_history import history_matrix, match_items, read_costs
    from plumbing.errors import InputError
    from policies.user_rule import read_rule_table

    costs = read_costs(inputs.costs)
    if costs.supplier is None:
        raise InputError(f"cost table '{inputs.costs}': no 'supplier' column; a catalogue names each item's supplier (docs/formats.md)")
    table = read_suppliers(inputs.suppliers)
    assigned = item_suppliers(costs.items, costs.supplier, table, inputs.costs, inputs.unassigned)
    history = history_matrix(inputs.history)
    match_items(history.items, costs, inputs.history, inputs.costs)
    if inputs.rules is not None:
        rules = read_rule_table(inputs.rules)
        known = set(costs.items)
        for item in rules.items:
            if item not in known:
                raise InputError(f"rule table '{inputs.rules}' item '{item}': not in the cost table '{inputs.costs}'")
        missing = [item for item in costs.items if item not in set(rules.items)]
        if missing:
            raise InputError(f"rule table '{inputs.rules}': no rule for item '{missing[0]}'; every item needs its rule")
    return costs, table, assigned, history


def identity(inputs: CatalogueInputs, options: CatalogueOptions, fit: dict) -> dict:
    """What a re-run must share to keep what a run wrote: the inputs' contents (SHA-256), the supplier of items without
    one, the fit's and the suppliers' settings."""
    from plumbing.files import file_sha256

    files = {name: (file_sha256(path) if path else None) for name, path in asdict(inputs).items() if name != "unassigned"}
    return {"files": files, "unassigned": inputs.unassigned, "fit": fit, "options": asdict(options)}


def supplier_inputs(instance: Instance, history, assigned: list[str], table, rules: str | None, out: Path) -> list[SupplierInputs]:
    """Each supplier's instance (catalogue/suppliers.py), its items' columns of the history and, with a rule table, its
    items' rows of it (written to out/rules/<folder>.csv, the table user-rule:PATH reads), in the supplier table's order."""
    from catalogue.suppliers import supplier_instances
    from policies.user_rule import read_rule_table, write_rule_table

    column = {item: k for k, item in enumerate(history.items)}
    table_rows = read_rule_table(rules) if rules is not None else None
    found = []
    for name, one in supplier_instances(instance, assigned, table).items():
        columns = [column[item] for item in one.item_names]
        ordered = None if history.ordered is None else history.ordered[:, columns]
        own = None
        if table_rows is not None:
            own = out / RULES / f"{folder_name(name)}.csv"
            write_rule_table(table_rows, one.item_names, own)
        found.append(SupplierInputs(name, one, history.demand[:, columns], ordered, None if own is None else str(own)))
    return found


SUPPLIER_SECONDS = 10.2
SECONDS_PER_LOG_ITEM = 14.9
"""A supplier's seconds in one process, SUPPLIER_SECONDS + SECONDS_PER_LOG_ITEM ln(n), besides its items' DP solves: the
policies' tuning, held-out evaluations and backtest, batched over the items (so growing far more slowly than their
count). A least-squares fit to 19 suppliers of 1 to 50 items at the paper's volumes, measured on this project's machine
(examples/catalogue's 3, simulated catalogues' 8 of 25 and 8 of 50 items: each within 0.75 to 1.11 of its prediction;
docs/benchmarks.md)."""
RAY_START_SECONDS = 10.0


def supplier_seconds(supplier: SupplierInputs, options: CatalogueOptions) -> float:
    """A supplier's predicted seconds in one process: the fit above, plus its items' fine DP solves as estimated
    (policies.dp_optimal.estimated_seconds, once per item: small at the paper's volumes, where the fit was made, and
    not calibrated at retail ones)."""
    from policies import dp_optimal
    from policies.decomposition import DecompositionOptions, item_instance

    one, settings = supplier.instance, DecompositionOptions().dp_settings()
    dp = sum(dp_optimal.estimated_seconds(item_instance(one, i, 0.0), options.horizon, 2, **settings)[1] for i in range(one.n))
    return SUPPLIER_SECONDS + SECONDS_PER_LOG_ITEM * math.log(one.n) + dp


def predicted_wall(seconds: list[float], cpus: int) -> float:
    """The suppliers' predicted wall seconds on `cpus` CPUs, Ray's start included where any runs: each supplier starts,
    in the order given (Ray's order of submission), on the first CPU free."""
    import heapq

    if not seconds:
        return 0.0
    free = [0.0] * cpus
    for each in seconds:
        heapq.heappush(free, heapq.heappop(free) + each)
    return RAY_START_SECONDS + max(free)


def write_fit(instance: Instance, report: dict, folder: Path) -> None:
    """The catalogue's fitted instance and its fit report (platform/fit.py's files) in `folder`, the instance last."""
    from demand.fit_report import report_figure, report_markdown
    from plumbing.files import atomic_write

    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / "instance.fit.json", json.dumps(report, indent=1) + "\n")
    atomic_write_text(folder / "instance.fit.md", report_markdown(report, "instance.fit.png"))
    atomic_write(folder / "instance.fit.png", lambda tmp: report_figure(report, tmp))
    instance.save(folder / "instance.json")


def fitted(inputs: CatalogueInputs, folder: Path, kept: bool, fit: dict) -> tuple[Instance, dict, bool]:
    """(instance, report, whether it was kept): the previous run's fit where `kept` and its files are whole, else a new one
    over every item (demand.fitting.fit_history; the catalogue instance's K is 0: each supplier's is its own)."""
    from demand.fitting import fit_history

    if kept:
        try:
            return Instance.load(folder / "instance.json"), json.loads((folder / "instance.fit.json").read_text(encoding="utf-8")), True
        except (OSError, ValueError):
            pass
    instance, report = fit_history(inputs.history, inputs.costs, 0.0, progress=True, **fit)
    write_fit(instance, report, folder)
    return instance, report, False


FIT_SECONDS_PER_CELL = 2.5e-6
"""The fit's seconds per item, period and bootstrap replicate (demand/bootstrap.py dominates), measured on this
project's machine with the examples' catalogue (docs/benchmarks.md)."""


def fit_predicted_seconds(shape: tuple[int, int], fit: dict) -> float:
    """The fit's predicted seconds for a history of `shape` [T, n]."""
    from demand.bootstrap import REPLICATES

    return FIT_SECONDS_PER_CELL * shape[0] * shape[1] * fit.get("replicates", REPLICATES)


def provisional_instance(costs, history) -> Instance:
    """The catalogue before its fit, for the plan's prediction: each item's mean demand as its lam, no factor, the cost
    table's lead and cap (or the default cap at that mean)."""
    from demand.sales_history import default_caps

    column = {item: k for k, item in enumerate(history.items)}
    lam = history.demand[:, [column[item] for item in costs.items]].mean(axis=0)
    qbar = costs.qbar if costs.qbar is not None else default_caps(lam, np.zeros_like(lam), costs.lead)
    source = {"item_names": list(costs.items)}
    return Instance(costs.h, costs.b, lam, np.zeros_like(lam), costs.lead, qbar, 0.0, 0.95, 0.5, source=source)


def run_catalogue(
    inputs: CatalogueInputs,
    out: Path,
    options: CatalogueOptions,
    fit: dict,
    workers: int,
    address: str | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """The whole catalogue (module docstring) into `out`: fit/, suppliers/<name>/, catalogue.md, index.html and
    catalogue.json (the identity, each supplier's headline, the total, the predicted and measured seconds). A folder
    of other inputs or settings is refused, or replaced with `overwrite`. Returns catalogue.json's content."""
    import ray
    from tqdm.auto import tqdm

    from catalogue.page import write_page
    from plumbing.errors import InputError
    from policies.decomposition import check_items
    from ray_access.session import init_ray, stop_ray

    started = time.perf_counter()
    costs, table, assigned, history = read_inputs(inputs)
    ident = identity(inputs, options, fit)
    manifest = out / MANIFEST
    try:
        previous = json.loads(manifest.read_text(encoding="utf-8")) if manifest.exists() else None
    except (OSError, ValueError):
        previous = {}  # a manifest cut short: a catalogue of unknown inputs
    if previous is None and out.is_dir() and any(out.iterdir()) and not overwrite:
        raise InputError(f"--out '{out}' holds files but no catalogue ({MANIFEST}); give an empty or new folder, or --overwrite")
    same = isinstance(previous, dict) and previous.get("identity") == ident
    if previous is not None and not same:
        if not overwrite:
            differ = [key for key in ident if (previous.get("identity") or {}).get(key) != ident[key]]
            raise InputError(
                f"--out '{out}' holds a catalogue of other {', '.join(differ)}; give --overwrite to replace it, or another --out"
            )
        for name in (FIT, SUPPLIERS, RULES):
            shutil.rmtree(out / name, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(manifest, json.dumps({"format": FORMAT, "identity": ident, "complete": False}, indent=1) + "\n")
    fit_kept = same and (out / FIT / "instance.json").exists()
    cpus = max(1, workers)
    provisional = supplier_inputs(provisional_instance(costs, history), history, assigned, table, None, out)
    kept_before = {s.name for s in provisional if same and (out / SUPPLIERS / folder_name(s.name) / SUPPLIER_RECORD).exists()}
    each = [supplier_seconds(s, options) for s in provisional if s.name not in kept_before]
    predicted = fit_predicted_seconds(history.demand.shape, fit) * (not fit_kept) + predicted_wall(each, cpus)
    print(
        f"catalogue: {costs.h.size} items from {len(provisional)} suppliers ({max(s.instance.n for s in provisional)} items at most); "
        f"the fit {'kept' if fit_kept else 'to run'}; {len(kept_before)} supplier(s) whole from a previous run, {len(each)} to run "
        f"({sum(each) / 60:.1f} min of work); predicted {predicted / 60:.1f} min on {cpus} CPUs",
        flush=True,
    )
    instance, report, fit_kept = fitted(inputs, out / FIT, same, fit)
    suppliers = supplier_inputs(instance, history, assigned, table, inputs.rules, out)
    for supplier in suppliers:  # before Ray starts: a cap no order fits, a DP too large, a window too long
        check_items(supplier.instance, options.horizon, DecompositionOptions(), f"supplier '{supplier.name}'", FORMS)
        check_supplier_window(supplier, options)
    folders = {s.name: out / SUPPLIERS / folder_name(s.name) for s in suppliers}
    records = {s.name: r for s in suppliers if (r := read_record(folders[s.name], s.instance)) is not None}
    to_run = [s for s in suppliers if s.name not in records]
    if records:
        print(f"kept {len(records)} whole supplier folder(s) of a previous run: {', '.join(sorted(records))}", flush=True)
    if to_run:
        owned = not ray.is_initialized()
        init_ray(workers, address)
        for supplier in to_run:  # a cut-short run's stage is not this run's
            (partial_folder(folders[supplier.name]) / PROGRESS).unlink(missing_ok=True)
        task = ray.remote(num_cpus=1, max_retries=2)(run_supplier)
        pending = {task.remote(s, folders[s.name], options): s for s in to_run}
        try:
            with tqdm(total=len(suppliers), initial=len(records), desc="suppliers", unit="supplier") as bar:
                while pending:
                    ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
                    if not ready:  # the running suppliers' stages, each second
                        bar.set_postfix_str(running_stages([folders[s.name] for s in pending.values()]))
                        continue
                    supplier = pending.pop(ready[0])
                    try:
                        records[supplier.name] = ray.get(ready[0])
                    except ray.exceptions.RayTaskError as exc:
                        if isinstance(exc.cause, InputError):
                            raise InputError(f"supplier '{supplier.name}': {exc.cause}") from None
                        raise
                    attempts = records[supplier.name]["attempts"]
                    if len(attempts) > 1:  # a lost node's (or killed process's) attempt before this one
                        nodes = ", ".join(str(a["node_name"]) for a in attempts)
                        tqdm.write(f"supplier '{supplier.name}' took {len(attempts)} attempts (on {nodes})")
                    bar.set_postfix_str(running_stages([folders[s.name] for s in pending.values()]), refresh=False)
                    bar.update(1)
        finally:  # a refusal or Ctrl-C ends an embedded Ray too; whole suppliers stay, a killed one's bound journal too
            if owned:
                stop_ray()
    ordered = [(folders[s.name].name, records[s.name]) for s in suppliers]
    total = catalogue_total([r for _, r in ordered])
    paired = paired_total([r for _, r in ordered], USER_RULE)
    settings = {"episodes": options.episodes, "horizon": options.horizon, "window": options.window}
    write_page(out, ordered, total, paired, report["flags"], settings)
    summary = {
        "format": FORMAT,
        "identity": ident,
        "complete": True,
        "suppliers": {
            r["supplier"]: {"folder": f, "n": r["n"], "recommended": r["recommended"], **r["held_out"][r["recommended"]]}
            for f, r in ordered
        },
        "total": total,
        "total_against_user_rule": paired,
        "kept": {"fit": fit_kept, "suppliers": sorted(set(records) - {s.name for s in to_run})},
        "predicted_seconds": predicted,
        "seconds": time.perf_counter() - started,
    }
    atomic_write_text(manifest, json.dumps(summary, indent=1) + "\n")
    return summary


@dataclass(frozen=True)
class Service:
    """One supplier's recommendation as the decision service deploys it: its route (/<route>/decide), its policy and the
    instance it acts on."""

    supplier: str
    route: str
    policy: PolicySpec
    instance: Path


def catalogue_services(out: Path) -> list[Service]:
    """Each supplier's recommendation in the whole catalogue folder `out` (its catalogue.json); one InputError where the
    folder holds no whole catalogue."""
    from plumbing.errors import InputError

    try:
        summary = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        summary = None
    if not isinstance(summary, dict) or summary.get("format") != FORMAT or not summary.get("complete"):
        raise InputError(f"--catalogue '{out}': not a whole catalogue folder (platform/recommend.py writes {MANIFEST} last)")
    return [
        Service(
            name, row["folder"], recommended_spec(out, row["folder"], row["recommended"]), out / SUPPLIERS / row["folder"] / "instance.json"
        )
        for name, row in summary["suppliers"].items()
    ]
