"""The group bound: the joint setup cost K split over groups of items instead of single items, each group solved exactly
by the joint DP (policies/joint_dp.py, its caps raised to whole units, itself a relaxation) with its share as its setup cost.

It is a relaxation for any split with sum_g k_g <= K and k_g >= 0: K 1{some item orders} >= sum_g k_g 1{some item of group g
orders}, and the relaxed problem separates by group. A group's value V_g(k) is concave in k, so the best split is the
decomposition's concave search (policies.decomposition.search_split) over groups; it runs on a coarse factor grid, and the
reported value is the groups' fine-grid values at the split it found (every split is a bound, on each grid); the groups are
any partition (every one is a bound), by default neighbours in share order (`groups_by_share`). Groups of one
item are the decomposition bound's items; one group of every item is the exact optimum. The argument and the figures:
docs/methods.md, "The group bound".
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from envs.instance import ITEM_COLUMNS, Instance
from policies import joint_dp
from policies.decomposition import DecompositionOptions, guess_shares, item_values, search_split

NAME = "group-bound"
GROUP_SIZE = 2
SEARCH_POINTS = 11
"""Factor grid points of the split search (each group's joint DP there takes about a quarter of its time on 41 points)."""


def groups_by_share(shares: np.ndarray, size: int = GROUP_SIZE) -> list[tuple[int, ...]]:
    """The items in groups of `size` (the last one smaller where size does not divide n), neighbours in the order of their
    shares of the decomposition's best split: items of similar order costs and frequencies order together most often. On
    the paper's n = 4 instance (seed 0, 21 points) this pairing, (0, 3) (1, 2), gives 1,638.5, against 1,631.5 for (0, 1)
    (2, 3) and 1,624.4 for (0, 2) (1, 3) (docs/methods.md)."""
    order = np.argsort(-np.asarray(shares, np.float64), kind="stable")
    return [tuple(sorted(int(i) for i in order[start : start + size])) for start in range(0, order.size, size)]


def group_instance(instance: Instance, group: tuple[int, ...], setup: float) -> Instance:
    """The items of `group` alone with setup cost `setup` (gamma, rho and the demand model of the instance)."""
    rows = list(group)
    loadings = None if instance.loadings is None else instance.loadings[rows]
    columns = {name: getattr(instance, name)[rows] for name in ITEM_COLUMNS} | ({} if loadings is None else {"beta": None})
    return Instance(
        **columns,
        K=float(setup),
        gamma=instance.gamma,
        rho=instance.rho,
        loadings=loadings,
        overdispersion=None if instance.overdispersion is None else instance.overdispersion[rows],
    )


def group_values(instance: Instance, group: tuple[int, ...], setups, horizon: int, points: int, options: DecompositionOptions):
    """V_g(k) for every k in `setups` on a grid of `points` factor points, an array [G]. A group of one item is its item DP (one pass)."""
    if len(group) == 1:
        return item_values(instance, group[0], setups, horizon, points, options)
    values = [
        joint_dp.solve(group_instance(instance, group, k), horizon, "raised", points, options.factor_width, tables=False).expected_cost
        for k in setups
    ]
    return np.array(values)


@dataclass
class GroupBound:
    """The group bound: `value` on options.factor_points grid points at the split `shares` [groups] that the search found on
    its grid (`search_value`: the chords' value there, a lower bound on the groups' values), the groups, and the seconds."""

    value: float
    search_value: float
    groups: list[tuple[int, ...]]
    shares: np.ndarray
    seconds: float

    def summary(self) -> dict:
        return {
            "value": self.value,
            "search_value": self.search_value,
            "groups": [list(g) for g in self.groups],
            "shares": self.shares.tolist(),
            "seconds": self.seconds,
        }


def group_bound(
    instance: Instance,
    horizon: int,
    options: DecompositionOptions,
    groups: list[tuple[int, ...]] | None = None,
    search_points: int = SEARCH_POINTS,
    progress: bool = False,
) -> GroupBound:
    """The group bound (module docstring) over `groups` (default: `groups_by_share` of the decomposition's first guess,
    policies.decomposition.guess_shares): the split searched on `search_points` factor points to options.tolerance within
    options.rounds, the value on options.factor_points. Raises joint_dp's errors (several factors, a group's DP beyond the
    memory) before any long solve."""
    start = time.perf_counter()
    first = guess_shares(instance)
    groups = groups_by_share(first) if groups is None else [tuple(g) for g in groups]
    for group in groups:
        joint_dp.check_joint(group_instance(instance, group, instance.K))
    guess = np.array([first[list(g)].sum() for g in groups])
    bar = tqdm(desc=f"{NAME}: group DPs", unit="DP", disable=not progress, leave=False)

    def values_of(round_, grids):
        values = []
        for group, grid in zip(groups, grids):
            values.append(group_values(instance, group, grid, horizon, search_points, options) if grid else [])
            bar.update(len(grid) if len(group) > 1 else 1)
        return values

    search = search_split(instance, options, values_of, guess)
    shares = search.split.shares
    value = sum(float(group_values(instance, g, [k], horizon, options.factor_points, options)[0]) for g, k in zip(groups, shares))
    bar.close()
    return GroupBound(value, search.split.value, groups, shares, time.perf_counter() - start)
