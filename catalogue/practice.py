"""A simulated practitioner's catalogue (platform/simulate_history.py --suppliers): the items cut into suppliers, each
supplier's K, a rule of thumb per item and the orders a weekly habit places. The inputs of platform/recommend.py for a
catalogue drawn from an instance, where no real practice exists (docs/fitting.md, "A catalogue in one command").

* Suppliers: S contiguous blocks of items as even as they go (supplier-01, ...), each with K = the instance's K
  times its share of the items (the paper family's K = 10 n gives each supplier 10 n_s).
* The rule of thumb: s_i = ceil(lam_i (L_i + 1)) (the lead time's mean demand) and S_i = s_i + ceil(3 lam_i).
* The weekly habit: every REVIEW periods from the first, a week's mean demand rounded up to cases of CASE units.
"""

from __future__ import annotations

import math

import numpy as np

from envs.instance import Instance

REVIEW = 7
CASE = 6


def supplier_blocks(n: int, suppliers: int) -> list[int]:
    """Each item's supplier (0..suppliers - 1): contiguous blocks whose sizes differ by at most one."""
    return [int(i * suppliers // n) for i in range(n)]


def supplier_rows(instance: Instance, suppliers: int) -> tuple[list[str], list[tuple[str, float]]]:
    """(each item's supplier name, the supplier table's rows (name, K))."""
    block = supplier_blocks(instance.n, suppliers)
    names = [f"supplier-{s + 1:0{len(str(suppliers))}d}" for s in range(suppliers)]
    sizes = np.bincount(block, minlength=suppliers)
    return [names[s] for s in block], [(names[s], instance.K * sizes[s] / instance.n) for s in range(suppliers)]


def rule_of_thumb(instance: Instance) -> list[tuple[float, float]]:
    """Each item's (s_i, S_i) (module docstring)."""
    rules = []
    for lam, lead in zip(instance.lam, instance.lead):
        reorder = math.ceil(lam * (lead + 1))
        rules.append((float(reorder), float(reorder + math.ceil(3 * lam))))
    return rules


def weekly_orders(instance: Instance, periods: int) -> np.ndarray:
    """The weekly habit's orders [T, n] (module docstring)."""
    week = CASE * np.ceil(REVIEW * instance.lam / CASE)
    return np.where((np.arange(periods) % REVIEW == 0)[:, None], week[None, :], 0.0)
