"""Solver back ends for a `MilpModel`: HiGHS (highspy, the default) and Gurobi (gurobipy matrix API).

Both take the same options, start from the model's all-zero warm start, and return a `SolveResult`
whose `bound` is the solver's proven dual bound (a valid lower bound even when the solve stops early).
Gurobi's PyPI licence is size-limited (2,000 variables or constraints): a model above it gets status
`licence-limit` (no incumbent), never a crash. A user's own licence (a licence file, or the WLS
variables GRB_WLSACCESSID, GRB_WLSSECRET, GRB_LICENSEID in the environment) is used when present.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import time
from dataclasses import dataclass

import numpy as np

from plumbing import validate
from solver_workers.model import MilpModel

SOLVERS = ("highs", "gurobi")
GUROBI_SIZE_LIMIT = 2000  # variables or constraints under the PyPI licence
GUROBI_SIZE_LIMIT_ERROR = 10010


@dataclass(frozen=True)
class SolverOptions:
    """Options of one solve (paper table "Rolling-horizon MILP solver setup")."""

    solver: str = "highs"
    """highs (default) or gurobi."""
    time_limit: float = 600.0
    """Seconds per decision (tau_max)."""
    gap: float = 0.005
    """Requested relative MIP gap (epsilon_MIP)."""
    threads: int = 1
    """Solver threads (one per worker by default)."""
    warm_start: bool = True
    """Supply the all-zero order plan as the initial incumbent."""
    seed: int = 0
    """Solver random seed."""

    def __post_init__(self):
        validate.choice(self.solver, "solver", SOLVERS)
        validate.time_limit(self.time_limit, "time_limit")
        validate.mip_gap(self.gap, "gap")
        validate.integer(self.threads, "threads", 1)
        validate.seed(self.seed, "seed")


def licence_note(solver: str, columns: int) -> str | None:
    """The note for a Gurobi run whose models hold at least `columns` variables, above the PyPI licence's
    size limit (platform/milp.py and bound.py print it; a sweep's dry run and run print it for each baseline)."""
    if solver != "gurobi" or columns <= GUROBI_SIZE_LIMIT:
        return None
    return (
        f"note: these Gurobi models hold at least {columns:,} variables, above the PyPI licence's limit of {GUROBI_SIZE_LIMIT:,} "
        "variables and constraints: without your own licence every solve is recorded with status 'licence-limit' and "
        "executes the zero fallback"
    )


@dataclass(frozen=True)
class SolveResult:
    status: str  # optimal | time-limit | licence-limit | infeasible | error:<detail>
    seconds: float
    objective: float | None  # incumbent objective (None without an incumbent)
    bound: float | None  # proven dual (lower) bound
    gap: float | None
    x: np.ndarray | None  # incumbent solution
    incumbents: tuple[tuple[float, float], ...] = ()  # (seconds, objective) of each improving solution (HiGHS)

    @property
    def has_incumbent(self) -> bool:
        return self.x is not None

    @property
    def time_limited(self) -> bool:
        return self.status == "time-limit"


def solve(model: MilpModel, options: SolverOptions) -> SolveResult:
    return (solve_highs if options.solver == "highs" else solve_gurobi)(model, options)


def _finite(value) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


@functools.cache
def _silence_highs_banner() -> None:
    """Make this process's first highspy.Highs with standard output sent to /dev/null: HiGHS prints its banner (two
    lines) on the first Highs a process makes, before any option can turn output off, and a solver worker's output
    reaches the driver's console (with Ray's prefix) between a script's own lines."""
    import highspy

    sys.stdout.flush()
    kept = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            highspy.Highs().setOptionValue("output_flag", False)
    finally:
        os.dup2(kept, 1)
        os.close(kept)


def load_highs(model: MilpModel, options: SolverOptions):
    """A highspy.Highs holding `model`, passed in one call from its arrays, with `options`' settings and output off;
    None when HiGHS rejects the model."""
    import highspy

    _silence_highs_banner()
    h = highspy.Highs()
    for key, value in (
        ("output_flag", False),
        ("threads", options.threads),
        ("time_limit", float(options.time_limit)),
        ("mip_rel_gap", float(options.gap)),
        ("random_seed", int(options.seed)),
    ):
        h.setOptionValue(key, value)
    A = model.matrix
    rows, cols, _ = model.shape
    status = h.passModel(
        cols,
        rows,
        int(A.nnz),
        1,
        1,
        0.0,
        model.cost,
        model.col_lower,
        model.col_upper,
        model.row_lower,
        model.row_upper,
        A.indptr.astype(np.int32),
        A.indices.astype(np.int32),
        A.data,
        model.integrality,
    )
    return None if status == highspy.HighsStatus.kError else h


def solve_highs(model: MilpModel, options: SolverOptions) -> SolveResult:
    import highspy

    h = load_highs(model, options)
    if h is None:
        return SolveResult("error:passModel rejected the model", 0.0, None, None, None, None)
    cols = model.shape[1]
    if options.warm_start:
        h.setSolution(cols, np.arange(cols, dtype=np.int32), model.warm_start)
    incumbents = []
    if model.integrality.any():
        h.setCallback(lambda kind, message, out, data_in, user: incumbents.append((out.running_time, out.objective_function_value)), None)
        h.startCallback(highspy.cb.HighsCallbackType.kCallbackMipImprovingSolution)
    start = time.perf_counter()
    h.run()
    seconds = time.perf_counter() - start
    model_status = h.getModelStatus()
    info = h.getInfo()
    has_solution = info.primal_solution_status == 2  # kSolutionStatusFeasible
    status = {
        highspy.HighsModelStatus.kOptimal: "optimal",
        highspy.HighsModelStatus.kTimeLimit: "time-limit",
        highspy.HighsModelStatus.kInfeasible: "infeasible",
    }.get(model_status, f"error:{h.modelStatusToString(model_status)}")
    x = np.asarray(h.getSolution().col_value) if has_solution else None
    objective = _finite(info.objective_function_value) if has_solution else None
    bound = _finite(info.mip_dual_bound) if model.integrality.any() else objective if status == "optimal" else None
    gap = _finite(info.mip_gap) if has_solution else None
    return SolveResult(status, seconds, objective, bound, gap, x, tuple(incumbents))


def gurobi_env():
    """A Gurobi environment with output off, using WLS credentials from the environment when set."""
    import gurobipy as gp

    params = {"OutputFlag": 0}
    if os.environ.get("GRB_WLSACCESSID") and os.environ.get("GRB_WLSSECRET") and os.environ.get("GRB_LICENSEID"):
        params.update(
            WLSACCESSID=os.environ["GRB_WLSACCESSID"], WLSSECRET=os.environ["GRB_WLSSECRET"], LICENSEID=int(os.environ["GRB_LICENSEID"])
        )
    return gp.Env(params=params)


def solve_gurobi(model: MilpModel, options: SolverOptions) -> SolveResult:
    import gurobipy as gp
    from gurobipy import GRB

    with gurobi_env() as env, gp.Model(env=env) as m:
        m.Params.TimeLimit = options.time_limit
        m.Params.MIPGap = options.gap
        m.Params.Threads = options.threads
        m.Params.Seed = options.seed
        vtype = np.where(
            model.integrality == 1, GRB.BINARY if np.all(model.col_upper[model.integrality == 1] <= 1) else GRB.INTEGER, GRB.CONTINUOUS
        )
        x = m.addMVar(model.shape[1], lb=model.col_lower, ub=model.col_upper, obj=model.cost, vtype=vtype)
        A = model.matrix.tocsr()
        lo, up = model.row_lower, model.row_upper
        equal = lo == up
        sense = np.where(equal, GRB.EQUAL, np.where(np.isfinite(up), GRB.LESS_EQUAL, GRB.GREATER_EQUAL))
        rhs = np.where(equal | np.isfinite(up), up, lo)
        m.addMConstr(A, x, sense, rhs)
        m.ModelSense = GRB.MINIMIZE
        if options.warm_start:
            x.Start = model.warm_start
        start = time.perf_counter()
        try:
            m.optimize()
        except gp.GurobiError as exc:
            if exc.errno == GUROBI_SIZE_LIMIT_ERROR:
                return SolveResult("licence-limit", time.perf_counter() - start, None, None, None, None)
            raise
        seconds = time.perf_counter() - start
        status = {GRB.OPTIMAL: "optimal", GRB.TIME_LIMIT: "time-limit", GRB.INFEASIBLE: "infeasible"}.get(
            m.Status, f"error:gurobi status {m.Status}"
        )
        has_solution = m.SolCount > 0
        return SolveResult(
            status,
            seconds,
            _finite(m.ObjVal) if has_solution else None,
            _finite(m.ObjBound) if m.IsMIP else (_finite(m.ObjVal) if status == "optimal" else None),
            _finite(m.MIPGap) if has_solution and m.IsMIP else None,
            np.asarray(x.X) if has_solution else None,
        )
