"""The decomposition lookahead policy (policies/lookahead.py) built from an instance: its tables come from a
decomposition bound run's folder (platform/bound.py --kind decomposition writes them under lookahead/), or,
without one, from the same computation in this process (the split search on the coarse grid, then each
item's DP at its share on the fine grid: solver_workers/decomposition.py, no Ray).

The threshold c (open iff sum_i g_i > c K) is tuned on the training paths like every classical policy:
each of THRESHOLDS is simulated on the same TUNING_EPISODES training episodes (TUNING_SEED, common random
numbers) and c = 1, the exact one-step lookahead, is kept unless another value is cheaper there.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from envs.evaluation import EVAL_HORIZON, evaluate
from envs.exogenous import TUNING_SEED, sample_paths
from envs.instance import Instance
from policies import lookahead
from policies.classical import TUNING_EPISODES
from solver_workers.decomposition import DecompositionOptions, check_items, item_table, item_values, search_split

THRESHOLDS = (0.5, 0.75, 1.0, 1.25, 1.5)
SPLITS = ("best", "equal")
DEFAULT_OPTIONS = DecompositionOptions()


def item_tables(
    instance: Instance,
    horizon: int,
    options: DecompositionOptions = DEFAULT_OPTIONS,
    split: str = "best",
    dtype: str = "float16",
    progress: bool = False,
    forms: tuple[str, ...] = lookahead.FORMS,
) -> list[lookahead.ItemTable]:
    """Every item's tables of `forms` in this process (a form not asked for is not solved): at the best split of
    the bound's search (`split` = "best") or at equal shares K/n ("equal")."""
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {SPLITS}, got {split!r}")
    check_items(instance, horizon, options, lookahead.NAME, forms)
    n = instance.n
    if split == "best":

        def values_of(round_: int, grids: list) -> list:
            return [
                item_values(instance, i, g, horizon, options.coarse_points, options) if g else []
                for i, g in enumerate(tqdm(grids, desc=f"split round {round_ + 1}", disable=not progress, leave=False))
            ]

        shares = search_split(instance, options, values_of).split.shares
    else:
        shares = np.full(n, instance.K / n)
    return [
        item_table(instance, i, float(shares[i]), horizon, options, dtype=dtype, forms=forms)
        for i in tqdm(range(n), desc="lookahead tables", disable=not progress, leave=False)
    ]


def tune_threshold(tables: lookahead.LookaheadTables, instance: Instance, horizon: int, device="cpu") -> tuple[float, dict]:
    """c from THRESHOLDS by the mean discounted cost on the training paths; c = 1 unless another is cheaper. The
    policies share the tables' device copy (`LookaheadTables.on`)."""
    paths = sample_paths(instance, TUNING_SEED, TUNING_EPISODES, horizon, device)
    tinst = instance.to_torch(device)
    means = {c: float(evaluate(lookahead.LookaheadPolicy(tables, c), tinst, paths).discounted_cost.mean()) for c in THRESHOLDS}
    best = min(means, key=means.get)
    return (best if means[best] < means[1.0] else 1.0), means


def lookahead_policy(
    instance: Instance,
    horizon: int = EVAL_HORIZON,
    device="cpu",
    form: str = "finite",
    bound: str | Path | None = None,
    threshold: float | None = None,
    split: str = "best",
    options: DecompositionOptions = DEFAULT_OPTIONS,
    progress: bool = False,
) -> tuple[lookahead.LookaheadPolicy, dict]:
    """(policy, parameters for a summary) of the decomposition lookahead on `instance`: tables of `form`
    from the bound run folder `bound` (that form read alone), else computed here (`item_tables`, that form
    solved alone); c = `threshold`, or tuned on the
    training paths (`tune_threshold`) when None."""
    start = time.perf_counter()
    if bound is not None:
        tables = lookahead.load_tables(bound, instance, form, horizon)
    else:
        items = item_tables(instance, horizon, options, split, progress=progress, forms=(form,))
        tables = lookahead.LookaheadTables.from_items(items, form, horizon, instance.content_hash())
    built = time.perf_counter() - start
    tuning = {}
    if threshold is None:
        threshold, tuning = tune_threshold(tables, instance, horizon, device)
    parameters = {
        "form": form,
        "threshold": threshold,
        "tuning_means": {str(c): m for c, m in tuning.items()},
        "split": split if bound is None else "best",
        "tables": str(bound) if bound is not None else "built in process",
        "table_bytes": tables.nbytes,
        "build_seconds": built,
        "tuning_seconds": time.perf_counter() - start - built,
    }
    return lookahead.LookaheadPolicy(tables, threshold), parameters
