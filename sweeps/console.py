"""What a sweep prints, and where the rest goes.

The console shows the plan, the baselines' progress bars, one line per finished, retried or failed trial, a lost
node, and the trial table at the end. Ray's own output (its driver log records, every worker's stdout and stderr,
Python warnings) goes to LOG_NAME in the results directory instead; with `verbose` it is printed as Ray prints it,
and Tune shows its own progress reports.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

import ray
from ray import tune

from ray_access.private import filter_autoscaler_events, route_worker_output

LOG_NAME = "sweep.log"
"""Ray's output of every run of the sweep, appended (the results directory's log file)."""
NODE_CHECK_SECONDS = 5.0
"""How often the trial loop looks for lost nodes (one GCS query)."""


class SweepLog:
    """LOG_NAME in `out`, opened for appending by `connect`, which routes Ray's output into it (unless verbose). A context
    manager: leaving it (or `close`, or `discard`) puts back all that `connect` replaced (Python's warning printer, the
    handlers of Ray's loggers, the handler by which Ray's driver prints its workers' output) and closes the log."""

    def __init__(self, out: Path, verbose: bool):
        self.path, self.verbose = out / LOG_NAME, verbose
        self.file: TextIO | None = None
        self.showwarning: Callable | None = None
        """Python's warning printer that `connect` replaced."""
        self.logger_handlers: dict[str, list[logging.Handler]] = {}
        """The handlers of each of Ray's loggers before they were routed into the log."""
        self.restore_worker_output: Callable[[], None] | None = None
        """Puts back Ray's printers of its workers' output and of the raylet's messages (route_worker_output)."""

    def __enter__(self) -> SweepLog:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def connect(self, init: Callable[[], str | None]) -> str | None:
        """Call `init` (which starts or reaches Ray, returning the dashboard's URL or None); unless verbose, open the
        log first and route Ray's driver records and warnings into it, and the workers' output once Ray runs."""
        if self.verbose:
            return init()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = self.path.open("a", encoding="utf-8", buffering=1)
        self.file.write(f"---- {time.strftime('%Y-%m-%d %H:%M:%S')} sweep driver pid {os.getpid()}\n")
        self.route_driver_records()
        self.showwarning, warnings.showwarning = warnings.showwarning, self.write_warning
        url = init()
        self.route_driver_records()  # loggers Ray configured while starting
        self.route_worker_output()
        return url

    def close(self) -> None:
        """Put back what `connect` replaced, and close the log; nothing when it replaced nothing (verbose, or closed)."""
        if self.showwarning is not None and warnings.showwarning == self.write_warning:
            warnings.showwarning = self.showwarning
        self.showwarning = None
        for name, handlers in self.logger_handlers.items():
            logging.getLogger(name).handlers = handlers
        self.logger_handlers = {}
        if self.restore_worker_output is not None:
            self.restore_worker_output()
        self.restore_worker_output = None
        if self.file is not None:
            self.file.close()
            self.file = None

    def discard(self, made: bool) -> None:
        """`close`, then remove the log and the dashboard's token of a sweep refused before it began (sweeps.runner.run_sweep's
        checks after connecting), and the results directory when this run `made` it and nothing else is in it."""
        self.close()
        for path in (self.path, self.path.parent / TOKEN_NAME):
            path.unlink(missing_ok=True)
        if made and self.path.parent.is_dir() and not any(self.path.parent.iterdir()):
            self.path.parent.rmdir()

    def route_driver_records(self) -> None:
        """Ray's loggers write to the log file instead of the terminal (their handlers kept for `close`)."""
        handler = logging.StreamHandler(self.file)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        for name in ["ray", *(n for n in logging.root.manager.loggerDict if n.startswith("ray."))]:
            logger = logging.getLogger(name)
            self.logger_handlers.setdefault(name, list(logger.handlers))
            for old in [h for h in logger.handlers if type(h) is not logging.FileHandler]:
                logger.removeHandler(old)
            if name == "ray":
                logger.addHandler(handler)

    def write_warning(self, message, category, filename, lineno, file=None, line=None) -> None:
        self.file.write(warnings.formatwarning(message, category, filename, lineno, line))

    def route_worker_output(self) -> None:
        """The driver relays every worker's stdout and stderr (log_to_driver) through Ray's stream dispatcher, whose
        handler "ray_print_logs" prints them, and the raylet's messages to the job bypass it: send both to
        write_worker_output (ray_access.private.route_worker_output)."""
        self.restore_worker_output = route_worker_output(self.write_worker_output)

    def write_worker_output(self, batch: dict, ignore_prefix: bool = False) -> None:
        """One batch of a worker's output lines into the log, unabridged, each line after the worker's name, pid and IP
        (`ignore_prefix`, of Ray's printer, is not used: the log always names the worker)."""
        lines = batch.get("lines", [])
        if batch.get("pid") == "autoscaler":  # its periodic status report too, unless filtered as Ray does
            lines = filter_autoscaler_events(lines)
        who = batch.get("actor_name") or batch.get("task_name") or ""
        where = f"({who} pid={batch.get('pid')}, ip={batch.get('ip')})"
        self.file.write("".join(f"{where} {line}\n" for line in lines))


def tune_output(log: Callable[[str], None], retries: int, verbose: bool) -> dict:
    """RunConfig settings: Tune's reporter when verbose; else TrialLines only (and verbosity 0, at which Tune's legacy
    output engine, chosen by platform/sweep.py, prints nothing)."""
    if verbose:
        return {"verbose": 1}
    return {"verbose": 0, "callbacks": [TrialLines(log, retries)]}


def last_error_line(trial) -> str:
    """The last line of the trial's error file (the exception), or a note where there is none."""
    try:
        lines = [line for line in Path(trial.error_file).read_text().splitlines() if line.strip()]
    except (OSError, TypeError):
        lines = []
    return lines[-1].strip() if lines else "(no error file)"


class TrialLines(tune.Callback):
    """Tune callback: one line per finished, retried or failed trial and per lost node, the trial table at the end."""

    def __init__(self, log: Callable[[str], None], retries: int):
        self.log, self.retries = log, retries
        self.alive: set[str] | None = None
        self.checked = 0.0

    def on_trial_complete(self, iteration, trials, trial, **info):
        result = trial.last_result or {}
        self.log(
            f"trial {trial} finished: {result.get('update', '?')} updates, greedy cost {result.get('greedy_mean', float('nan')):,.1f}, "
            f"{result.get('time_total_s', 0):.0f} s"
        )

    def on_trial_recover(self, iteration, trials, trial, **info):
        failures = trial.run_metadata.num_failures
        self.log(
            f"trial {trial} failed (attempt {failures} of {self.retries + 1}), retrying from its last checkpoint: {last_error_line(trial)}"
        )

    def on_trial_error(self, iteration, trials, trial, **info):
        self.log(
            f"trial {trial} failed after {trial.run_metadata.num_failures} attempts, no retry left: {last_error_line(trial)} "
            f"(details: {trial.error_file})"
        )

    def on_step_begin(self, iteration, trials, **info):
        """Say once when a node of the cluster is lost (not alive any more)."""
        if time.monotonic() - self.checked < NODE_CHECK_SECONDS:
            return
        self.checked = time.monotonic()
        nodes = ray.nodes()
        alive = {n["NodeID"] for n in nodes if n["Alive"]}
        for node in nodes:
            if self.alive is not None and node["NodeID"] in self.alive - alive:
                self.log(f"node {node['NodeName']} ({node['NodeID'][:12]}, {node['NodeManagerAddress']}) lost")
        self.alive = alive

    def on_experiment_end(self, trials, **info):
        rows = [
            (
                str(t),
                t.status,
                t.run_metadata.num_failures,
                (t.last_result or {}).get("update", ""),
                (t.last_result or {}).get("greedy_mean"),
            )
            for t in trials
        ]
        if not rows:
            return
        width = max(len(r[0]) for r in rows)
        self.log(f"{'trial':<{width}}  {'status':<10}  {'failures':>8}  {'updates':>7}  {'greedy cost':>11}")
        for name, status, failures, updates, greedy in rows:
            self.log(f"{name:<{width}}  {status:<10}  {failures:>8}  {updates:>7}  {'' if greedy is None else f'{greedy:,.1f}':>11}")


TOKEN_NAME = "dashboard-token"
"""The embedded Ray's token, for the dashboard's login, in the results directory (readable by its owner only)."""


def dashboard_login(out: Path) -> str:
    """How to log in to the dashboard of the embedded Ray (token authentication, ray_access.session)."""
    if os.environ.get("RAY_AUTH_MODE") == "disabled":
        return "no login: token authentication is off"
    if os.environ.get("RAY_AUTH_TOKEN_PATH") and not os.environ.get("RAY_AUTH_TOKEN"):
        return f"its token is in {os.environ['RAY_AUTH_TOKEN_PATH']}"
    path = out / TOKEN_NAME
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(descriptor, 0o600)  # also when an earlier run left the file
    with os.fdopen(descriptor, "w") as file:
        file.write(os.environ["RAY_AUTH_TOKEN"] + "\n")
    return f"it asks for this run's token: in {path}"
