"""The rolling-horizon deterministic-equivalent MILP (paper appendix "MILP solver setup"), built from
whole index arrays into one sparse matrix.

Formulation. The paper's model (eqs. milp_objective - milp_domains) with the net inventory I
eliminated: the post-demand stock N_{i,u} = I_{i,u} - D_{i,u} is written R+_{i,u} - R-_{i,u}, and
eq. (milp_inventory_dynamics) becomes one balance row per (scenario, item, step):

    u = 0:  R+_{i,0} - R-_{i,0}                                        = I_{i,t} - D_{i,0}
    u >= 1: R+_{i,u} - R-_{i,u} - R+_{i,u-1} + R-_{i,u-1} - O_{i,u-L_i} = P_{i,u,t} - D_{i,u}

Since h, b > 0, an optimum has min(R+, R-) = 0, so R+ and R- are the positive and negative parts of
N exactly as eqs. (milp_holding_linearization), (milp_backlog_linearization) make them. The root
decisions Y_0 and O_{i,0} are single columns shared by every scenario (the non-anticipativity
constraints eqs. milp_root_opening_nonanticipativity, milp_root_quantity_nonanticipativity, with the
aliases substituted), and the columns that tail fixing forces to zero (eqs. milp_quantity_tail_fixing,
milp_opening_tail_fixing) are not created. Coupling eq. (milp_joint_order_coupling) is O <= qbar Y,
with 0 <= O <= qbar as a bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from envs.demand_law import draw_demand, item_rates
from envs.exogenous import factor_step
from envs.instance import LMAX, Instance, factor_shape
from plumbing.errors import InputError


@dataclass(frozen=True)
class MilpModel:
    """min cost.x  s.t.  row_lower <= A x <= row_upper,  col_lower <= x <= col_upper,  x_j integer where integrality_j = 1."""

    cost: np.ndarray
    col_lower: np.ndarray
    col_upper: np.ndarray
    integrality: np.ndarray  # int32, 1 = integer
    matrix: sp.csc_matrix
    row_lower: np.ndarray
    row_upper: np.ndarray
    root_open: int  # column of Y_0
    root_quantity: np.ndarray  # [n] column of O_{i,0}, -1 where tail fixing removes it (L_i >= H)
    warm_start: np.ndarray  # the all-zero order plan with its implied R+ and R-

    @property
    def shape(self) -> tuple[int, int, int]:
        """(rows, columns, non-zeros)."""
        return self.matrix.shape[0], self.matrix.shape[1], int(self.matrix.nnz)

    def root_action(self, x: np.ndarray, qbar: np.ndarray) -> tuple[int, np.ndarray]:
        """The root action (Y_0, O_0) of a solution, with O_0 = 0 when Y_0 = 0."""
        open_order = int(round(float(x[self.root_open])))
        quantity = np.where(self.root_quantity >= 0, x[np.maximum(self.root_quantity, 0)], 0.0)
        return open_order, np.clip(quantity, 0.0, qbar) * open_order


INDEX_MAX = 2**31 - 1
"""HiGHS indexes its matrix (columns, rows, non-zeros) with 32-bit integers."""


def stock_columns(n: int, scenarios: int, horizon: int) -> int:
    """2 S n H: the R+ and R- columns that every model of n items, S scenarios and H steps holds (a lower bound on its size)."""
    return 2 * scenarios * n * horizon


def check_size(n: int, scenarios: int, horizon: int, where: str) -> None:
    """Refuse, naming `where`, a model too large to build: each stock column is a non-zero of its balance row and
    (but in the last step) of the next, so the matrix holds at least 2 S n (2H - 1) non-zeros."""
    nonzeros = 2 * scenarios * n * (2 * horizon - 1)
    if nonzeros > INDEX_MAX:
        raise InputError(
            f"{where}: the rolling-horizon MILP of n = {n:,} items, S = {scenarios:,} scenarios and H = {horizon:,} steps holds at "
            f"least {nonzeros:,} non-zeros, more than HiGHS's 32-bit indices address ({INDEX_MAX:,}; and about "
            f"{nonzeros * 12 / 2**30:,.0f} GiB of memory): lower S or H"
        )


def sample_scenarios(instance: Instance, factor: float | list[float], scenarios: int, horizon: int, rng: np.random.Generator) -> np.ndarray:
    """Demand scenarios D[omega, u, i] conditional on F_0 = factor (a number at k = 1, else k numbers), eqs.
    (milp_factor_scenarios), (milp_demand_scenarios): the factor path by `factor_step`, the demand by `draw_demand`
    (negative binomial with the instance's overdispersion)."""
    start = np.asarray(factor, dtype=np.float64)
    shape = factor_shape(instance.factors)
    if start.shape != shape:
        raise ValueError(
            f"factor: expected {'a number' if not shape else f'{shape[0]} numbers'} ({instance.demand_model()}), got shape {start.shape}"
        )
    f = np.empty((scenarios, horizon, *shape))
    f[:, 0] = start
    noise = rng.standard_normal((scenarios, horizon - 1, *shape))
    for u in range(horizon - 1):
        f[:, u + 1] = factor_step(instance.rho, f[:, u], noise[:, u])
    return draw_demand(item_rates(instance, f), instance.overdispersion, rng).astype(np.float64)


def build_model(
    instance: Instance, inventory: np.ndarray, in_transit: np.ndarray, demand: np.ndarray, gamma: float | None = None
) -> MilpModel:
    """Build the model for the observed state (I_t [n], P_t [n, LMAX-1]) and scenarios demand [S, H, n]."""
    S, H, n = demand.shape
    gamma = instance.gamma if gamma is None else gamma
    lead = instance.lead.astype(np.int64)
    discount = gamma ** np.arange(H)
    next_col = 0

    def new_cols(count):
        nonlocal next_col
        cols = np.arange(next_col, next_col + count)
        next_col += count
        return cols

    # ---- columns --------------------------------------------------------------------------------
    open_horizon = H - int(lead.min())  # Y_u exists for u < H - L_min
    y_col = np.full((S, H), -1)
    if open_horizon >= 1:
        y_col[:, 0] = new_cols(1)[0]
        if open_horizon > 1:
            y_col[:, 1:open_horizon] = new_cols(S * (open_horizon - 1)).reshape(S, open_horizon - 1)
    root_open = int(y_col[0, 0]) if open_horizon >= 1 else new_cols(1)[0]  # a fixed-zero Y_0 when no order can arrive in time
    has_order = np.arange(H)[None, :] < (H - lead)[:, None]  # [n, H] O_{i,u} exists for u < H - L_i
    o_col = np.full((S, n, H), -1)
    root_items = np.nonzero(has_order[:, 0])[0]
    o_col[:, root_items, 0] = new_cols(root_items.size)
    later = np.broadcast_to(has_order[None, :, 1:], (S, n, H - 1))
    o_later = o_col[:, :, 1:]
    o_later[later] = new_cols(int(later.sum()))
    o_col[:, :, 1:] = o_later
    plus_col = new_cols(S * n * H).reshape(S, n, H)
    minus_col = new_cols(S * n * H).reshape(S, n, H)
    num_col = next_col

    cost = np.zeros(num_col)
    col_lower = np.zeros(num_col)
    col_upper = np.full(num_col, np.inf)
    integrality = np.zeros(num_col, dtype=np.int32)
    integrality[root_open] = 1
    col_upper[root_open] = 1.0 if open_horizon >= 1 else 0.0
    cost[root_open] = instance.K
    if open_horizon > 1:
        later_y = y_col[:, 1:open_horizon]
        cost[later_y] = instance.K * discount[None, 1:open_horizon] / S
        integrality[later_y] = 1
        col_upper[later_y] = 1.0
    valid_o = o_col >= 0
    col_upper[o_col[valid_o]] = np.broadcast_to(instance.qbar[None, :, None], (S, n, H))[valid_o]
    cost[plus_col] = discount[None, None, :] * instance.h[None, :, None] / S
    cost[minus_col] = discount[None, None, :] * instance.b[None, :, None] / S

    # ---- balance rows: one per (omega, i, u) ---------------------------------------------------
    balance = np.arange(S * n * H).reshape(S, n, H)
    rows, cols, vals = [balance.ravel(), balance.ravel()], [plus_col.ravel(), minus_col.ravel()], [np.ones(S * n * H), -np.ones(S * n * H)]
    rows += [balance[:, :, 1:].ravel(), balance[:, :, 1:].ravel()]
    cols += [plus_col[:, :, :-1].ravel(), minus_col[:, :, :-1].ravel()]
    vals += [-np.ones(S * n * (H - 1)), np.ones(S * n * (H - 1))]
    u = np.arange(H)
    arrival_src = u[None, :] - lead[:, None]  # [n, H] the order period that arrives at u
    ok = arrival_src >= 0
    src = np.where(ok, arrival_src, 0)
    arriving = np.take_along_axis(o_col, np.broadcast_to(src[None], (S, n, H)), axis=2)  # [S, n, H]
    mask = np.broadcast_to(ok[None], (S, n, H)) & (arriving >= 0)
    rows.append(balance[mask]), cols.append(arriving[mask]), vals.append(-np.ones(int(mask.sum())))
    pipeline = np.zeros((n, H))
    slots = min(LMAX - 1, H - 1)
    pipeline[:, 1 : 1 + slots] = in_transit[:, :slots]
    rhs = pipeline[None] - np.transpose(demand, (0, 2, 1))  # [S, n, H]
    rhs[:, :, 0] += inventory[None, :]

    # ---- coupling rows: O - qbar Y <= 0, one per existing O column (root: one per item) --------
    o_keys = np.argwhere(valid_o)  # [k, 3] (omega, i, u)
    o_keys = o_keys[(o_keys[:, 2] > 0) | (o_keys[:, 0] == 0)]  # root columns once
    first_coupling = S * n * H
    coupling = first_coupling + np.arange(o_keys.shape[0])
    o_idx = o_col[o_keys[:, 0], o_keys[:, 1], o_keys[:, 2]]
    y_idx = np.where(o_keys[:, 2] == 0, root_open, y_col[o_keys[:, 0], o_keys[:, 2]])
    rows += [coupling, coupling]
    cols += [o_idx, y_idx]
    vals += [np.ones(coupling.size), -instance.qbar[o_keys[:, 1]]]
    num_row = first_coupling + coupling.size

    matrix = sp.csc_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(num_row, num_col))
    row_lower = np.concatenate([rhs.ravel(), np.full(coupling.size, -np.inf)])
    row_upper = np.concatenate([rhs.ravel(), np.zeros(coupling.size)])

    # ---- the all-zero plan: N_u = I - cumulative demand + cumulative pipeline -----------------
    post_demand = np.cumsum(rhs, axis=2)  # [S, n, H]
    warm = np.zeros(num_col)
    warm[plus_col] = np.maximum(post_demand, 0)
    warm[minus_col] = np.maximum(-post_demand, 0)
    return MilpModel(
        cost,
        col_lower,
        col_upper,
        integrality,
        matrix,
        row_lower,
        row_upper,
        root_open,
        np.where(has_order[:, 0], o_col[0, :, 0], -1),
        warm,
    )
