"""The perfect-information bound: the deterministic JRP of one episode with its realised demands known
in advance (same dynamics, caps, initial state and discount). Its optimum is at most the cost of any
non-anticipative policy on that episode, so its mean over episodes bounds every method from below.

Two valid lower bounds are computed and the larger is reported:

* Facility location (exact with caps). With linear holding and backlog costs the cost of an order plan
  equals the cheapest matching of supply units to demand units (FIFO attains it). Fixed supply (initial
  stock, in-transit) arrives before any new order can, so it serves the earliest demand; the rest,
  r_{i,w}, is served by orders: f_{i,v,w} is the fraction of r_{i,w} served by the order at v (arriving
  at a = v + L_i), z_{i,w} the fraction never served in the horizon. Rows: sum_v f + z = 1;
  f_{i,v,w} <= Y_v; sum_w r_{i,w} f_{i,v,w} <= qbar_i Y_v. Its LP relaxation is tight; solved as a MIP,
  the proven dual bound counts even when the time limit stops it.
* Uncapacitated DP (exact without caps, so a lower bound with them). Between two consecutive open
  periods each demand is served by the cheaper of the two neighbouring orders, so a shortest path over
  open periods solves it exactly in O(T^2 n T) array work, at any n.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from envs.instance import LMAX, Instance
from solver_workers.backends import SolverOptions, solve
from solver_workers.model import MilpModel


@dataclass(frozen=True)
class EpisodeData:
    """Fixed-supply pre-matching of one episode: the constant cost and the residual demand r [n, T]."""

    constant: float
    residual: np.ndarray  # [n, T]
    discount_prefix: np.ndarray  # [T+1] G[k] = sum_{u<k} gamma^u


def prepare(instance: Instance, demand: np.ndarray, inventory: np.ndarray, in_transit: np.ndarray) -> EpisodeData:
    """demand [T, n]. Matches fixed supply to the earliest demand (FIFO) and returns its cost."""
    T, n = demand.shape
    gamma = instance.gamma ** np.arange(T)
    arrivals = np.zeros((n, T))
    arrivals[:, 0] = np.maximum(inventory, 0)
    slots = min(LMAX - 1, T - 1)
    arrivals[:, 1 : 1 + slots] += in_transit[:, :slots]
    supply = np.cumsum(arrivals, axis=1)  # [n, T] available by u
    cum_demand = np.cumsum(demand.T, axis=1) + np.maximum(-inventory, 0)[:, None]  # backlog counts as demand at 0
    total_fixed = supply[:, -1:]
    matched = np.minimum(cum_demand, total_fixed)
    diff = supply - matched
    constant = float(np.sum(gamma * (instance.h[:, None] * np.maximum(diff, 0) + instance.b[:, None] * np.maximum(-diff, 0))))
    residual_cum = np.maximum(cum_demand - total_fixed, 0)
    residual = np.diff(residual_cum, axis=1, prepend=0.0)
    return EpisodeData(constant, residual, np.concatenate([[0.0], np.cumsum(gamma)]))


def pair_cost(instance: Instance, prefix: np.ndarray, item, arrival, w) -> np.ndarray:
    """Discounted cost of one unit of item `item`'s demand in period w served by a unit arriving at
    `arrival` (>= T: never served): holding from the arrival to w, or backlog from w to the arrival.
    Arguments broadcast; prefix[k] = sum_{u<k} gamma^u."""
    a = np.minimum(arrival, prefix.size - 1)
    return np.where(a <= w, instance.h[item] * (prefix[w] - prefix[a]), instance.b[item] * (prefix[a] - prefix[w]))


def uncapacitated_bound(instance: Instance, data: EpisodeData) -> tuple[float, list[int]]:
    """Exact optimum of the episode without the caps qbar (a lower bound with them), and its open periods."""
    n, T = data.residual.shape
    lead = instance.lead.astype(np.int64)[:, None]
    items, w = np.arange(n)[:, None], np.arange(T)[None, :]
    prefix = data.discount_prefix
    r = data.residual
    never = pair_cost(instance, prefix, items, np.full((n, 1), T), w)  # [n, T]

    def segment(v1: int, v2: int) -> float:
        """Cost of the demand between the arrivals of consecutive open periods v1 < v2 (-1: none before; T: none after)."""
        lo = np.zeros((n, 1), dtype=np.int64) if v1 < 0 else v1 + lead
        hi = np.full((n, 1), T) if v2 >= T else np.minimum(v2 + lead, T)
        inside = (w >= lo) & (w < hi)
        later = never if v2 >= T else pair_cost(instance, prefix, items, v2 + lead, w)
        cost = later if v1 < 0 else np.minimum(pair_cost(instance, prefix, items, v1 + lead, w), later)
        return float(np.sum(np.where(inside, r * cost, 0.0)))

    last = T - int(lead.min())  # an order at v >= T - L_min arrives after the horizon for every item
    setup = instance.K * instance.gamma ** np.arange(T)
    best = np.full(last, np.inf)
    parent = np.full(last, -1)
    for v in range(last):
        best[v] = setup[v] + segment(-1, v)
        for u in range(v):
            candidate = best[u] + setup[v] + segment(u, v)
            if candidate < best[v]:
                best[v], parent[v] = candidate, u
    value, tail = segment(-1, T), -1
    for v in range(last):
        total = best[v] + segment(v, T)
        if total < value:
            value, tail = total, v
    opens = []
    while tail >= 0:
        opens.append(int(tail))
        tail = parent[tail]
    return data.constant + value, sorted(opens)


def facility_location_model(instance: Instance, data: EpisodeData) -> tuple[MilpModel, dict[str, Any]]:
    """The capacitated facility-location MILP of the episode (objective without the constant)."""
    n, T = data.residual.shape
    lead = instance.lead.astype(np.int64)
    r = data.residual
    last = max(T - int(lead.min()), 0)
    item, order, demand_w = np.nonzero((np.arange(T)[None, :, None] < (T - lead)[:, None, None]) & (r[:, None, :] > 0))
    keep = order < last
    item, order, demand_w = item[keep], order[keep], demand_w[keep]
    served = np.nonzero(r > 0)
    n_y, n_f, n_z = last, item.size, served[0].size
    y_cols, f_cols, z_cols = np.arange(n_y), n_y + np.arange(n_f), n_y + n_f + np.arange(n_z)
    cost = np.concatenate(
        [
            instance.K * instance.gamma ** np.arange(n_y),
            r[item, demand_w] * pair_cost(instance, data.discount_prefix, item, order + lead[item], demand_w),
            r[served] * pair_cost(instance, data.discount_prefix, served[0], np.full(n_z, T), served[1]),
        ]
    )
    # demand rows: one per (i, w) with r > 0
    demand_row = np.full((n, T), -1)
    demand_row[served] = np.arange(n_z)
    rows = [demand_row[item, demand_w], demand_row[served]]
    cols = [f_cols, z_cols]
    vals = [np.ones(n_f), np.ones(n_z)]
    # f_{i,v,w} <= Y_v
    vub = n_z + np.arange(n_f)
    rows += [vub, vub]
    cols += [f_cols, y_cols[order]]
    vals += [np.ones(n_f), -np.ones(n_f)]
    # sum_w r f <= qbar Y_v, one row per (i, v) with some f
    pair = item * T + order
    pairs, pair_row = np.unique(pair, return_inverse=True)
    cap = n_z + n_f + pair_row
    cap_rows = n_z + n_f + np.arange(pairs.size)
    rows += [cap, cap_rows]
    cols += [f_cols, y_cols[pairs % T]]
    vals += [r[item, demand_w], -instance.qbar[pairs // T]]
    num_row = n_z + n_f + pairs.size
    num_col = n_y + n_f + n_z
    matrix = sp.csc_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(num_row, num_col))
    row_lower = np.concatenate([np.ones(n_z), np.full(n_f + pairs.size, -np.inf)])
    row_upper = np.concatenate([np.ones(n_z), np.zeros(n_f + pairs.size)])
    col_upper = np.ones(num_col)
    integrality = np.zeros(num_col, dtype=np.int32)
    integrality[y_cols] = 1
    warm = np.zeros(num_col)
    warm[z_cols] = 1.0  # the zero plan: nothing ordered, every residual demand unserved
    model = MilpModel(
        cost,
        np.zeros(num_col),
        col_upper,
        integrality,
        matrix,
        row_lower,
        row_upper,
        root_open=0,
        root_quantity=np.full(n, -1),
        warm_start=warm,
    )
    return model, {"item": item, "order": order, "demand_w": demand_w}


def episode_bound(
    instance: Instance, demand: np.ndarray, inventory: np.ndarray, in_transit: np.ndarray, options: SolverOptions
) -> dict[str, Any]:
    """The bound of one episode: max(facility-location dual bound, uncapacitated DP), with the MILP's
    incumbent order plan (open [T], quantity [T, n]) when it has one."""
    start = time.perf_counter()
    data = prepare(instance, demand, inventory, in_transit)
    dp_value, _ = uncapacitated_bound(instance, data)
    model, index = facility_location_model(instance, data)
    result = solve(model, options)
    mip_bound = None if result.bound is None else data.constant + result.bound
    mip_wins = mip_bound is not None and mip_bound >= dp_value - 1e-9 * max(1.0, abs(dp_value))  # ties go to the exact formulation
    bound = max(dp_value, mip_bound) if mip_bound is not None else dp_value
    T, n = demand.shape
    plan_open, plan_quantity = np.zeros(T), np.zeros((T, n))
    if result.has_incumbent:
        last = model.integrality.sum()
        plan_open[:last] = np.round(result.x[:last])
        f = result.x[last : last + index["item"].size]
        np.add.at(plan_quantity, (index["order"], index["item"]), f * data.residual[index["item"], index["demand_w"]])
        plan_quantity = np.minimum(plan_quantity, instance.qbar) * plan_open[:, None]
    return {
        "bound": bound,
        "source": "facility-location" if mip_wins else "uncapacitated-dp",
        "status": result.status,
        "mip_bound": mip_bound,
        "uncapacitated_bound": dp_value,
        "incumbent": None if result.objective is None else data.constant + result.objective,
        "gap": result.gap,
        "seconds": time.perf_counter() - start,
        "plan_open": plan_open.tolist(),
        "plan_quantity": plan_quantity.tolist(),
    }


def solved_note(optimal: int, episodes: int) -> str:
    """How many of the perfect-information bound's episodes were solved to optimality, and what the others report."""
    if optimal == episodes:
        return f"all {episodes} solved to optimality"
    rest = episodes - optimal
    return f"{optimal} solved to optimality; the other {rest} report {'a proven dual bound' if rest == 1 else 'proven dual bounds'}"
