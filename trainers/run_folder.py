"""One training run on disk, for every trainer: the run folder's modes (new, resume, overwrite), the training curve
(Parquet and TensorBoard), periodic checkpoints, resumption, divergence as a recorded result, Ctrl-C / SIGTERM as a
saved interruption, and a progress bar. The folder's files: docs/formats.md, "Training run folder"; the modes and
what an interruption or a failure leaves: docs/runs-and-results.md, "Training runs".

A run's life is written once, here: `open_run` (check the folder for its mode and the method's inputs before anything
is written, prepare it, read the resume point; a folder it made and left empty is removed), then a `RunAttempt`
(return at once when the run has ended; build the trainer, warm-start it, save the update-0 checkpoint, update it).
`train_run` is the two in one process. A method supplies its parts as a `MethodRun` that builds its trainer:
trainers.pathwise's `PathwiseRun`, trainers.rllib_ppo's `PPORun`, and trainers.ray_train's worker, whose driver opens
the run and whose every start of the workers makes an attempt.

Guarantees: curve.parquet is written before checkpoint.pt, so a checkpoint never names an update the curve lacks; an
interruption lets the current update (or imitation update) finish and saves it with status `interrupted`, a second
one stops at once keeping the last checkpoint; a failed update or warm start saves the run at its last finished
update with status `failed` and the error's first line (where the method can: `MethodRun.saves_after_failure`),
then raises again. The checkpoint and training.json's `attempts` list the update each attempt started from.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import pyarrow as pa
from tqdm.auto import tqdm

from envs.instance import Instance
from plumbing.errors import InputError, first_line
from plumbing.files import atomic_write_text, read_parquet, written_by_atomic_write
from plumbing.validate import differences
from run_results.records import RUNS, TRAINING, check_run_folder, clear_run, manifest, write_parquet
from trainers.checkpoint import BEST, LAST, CheckpointError, read_checkpoint, save_checkpoint
from trainers.config import TrainerConfig
from trainers.model_selection import Score, best_network_state, validation_record

MODES = ("new", "resume", "overwrite")
RUN_FILES = RUNS[TRAINING]
OnUpdate = Callable[[int, dict[str, float]], None] | None
"""Called after each update made in this process with (update, metrics)."""
CURVE_COLUMNS = ("method", "n", "seed", "update", "cost10", "wall_seconds", "validation_cost", "restarted")


def run_files(out: Path) -> list[str]:
    """The names in `out` that belong to a run: RUN_FILES and the temporary files of their atomic writes."""
    if not out.is_dir():
        return []
    return sorted(p.name for p in out.iterdir() if p.name in RUN_FILES or written_by_atomic_write(p.name) in RUN_FILES)


def check_run_dir(out_dir: str | os.PathLike, mode: str) -> Path:
    """Check, before any work, that the run folder suits `mode` (module docstring); changes nothing."""
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {list(MODES)}, got {mode!r}")
    out = Path(out_dir)
    check_run_folder(out, TRAINING, overwrite=mode == "overwrite", resumable=True)
    found = run_files(out)
    if mode == "new" and found:
        raise InputError(
            f"run folder '{out}' already holds a run ({', '.join(found)}): continue it with --resume or replace it with --overwrite"
        )
    if mode == "resume" and not (out / LAST).is_file():
        hint = "start anew with --overwrite" if found else "run without --resume to start it"
        raise InputError(f"run folder '{out}' has no checkpoint.pt to resume: {hint}")
    return out


def start_run_dir(out_dir: str | os.PathLike, mode: str) -> Path:
    """`check_run_dir`, then (mode overwrite) remove the previous run's files, whatever its kind, and make the folder."""
    out = check_run_dir(out_dir, mode)
    if mode == "overwrite":
        clear_run(out)
    out.mkdir(parents=True, exist_ok=True)
    return out


def check_resumable(ckpt: dict[str, Any], config: TrainerConfig, instance: Instance, path: Path) -> None:
    """Raises CheckpointError unless the checkpoint's stored config and `config` differ only in `updates` (not below the checkpoint's
    update) and the memory fields (TrainerConfig.memory_fields), on the same instance. A field the stored config lacks (added later)
    counts as its default, the value that run had. The refusal names each differing field with both values
    (plumbing.validate.differences), or, for another method, the method alone."""
    defaults = {f.name: f.default for f in fields(config) if f.default is not MISSING}
    free = {"updates": 0} | dict.fromkeys(config.memory_fields())
    stored, wanted = defaults | ckpt["config"] | free, config.to_dict() | free
    if stored["method"] != wanted["method"]:
        stored, wanted = {"method": stored["method"]}, {"method": wanted["method"]}
    if changed := differences(stored, wanted):
        raise CheckpointError(
            f"checkpoint '{path}' belongs to a run with other settings ({'; '.join(changed)}): only 'updates' may change on resume; "
            "resume with its settings, or start anew with --overwrite"
        )
    if ckpt["instance"].to_dict() != instance.to_dict():
        raise CheckpointError(f"checkpoint '{path}': it was trained on a different instance")
    done = int(ckpt["trainer"]["update"])
    if done > config.updates:
        raise CheckpointError(
            f"checkpoint '{path}' holds update {done}, more than this run's {config.updates} updates: resume with at least {done}"
        )


def read_curve(path: Path, done: int) -> list[dict[str, Any]]:
    """The curve rows of updates 1..done (a checkpoint's update); refused when any is missing, since they cannot be rebuilt."""
    cannot = (
        f"the checkpoint holds update {done} and the curve cannot be rebuilt, so the run cannot be resumed: start anew with --overwrite"
    )
    if not path.is_file():
        raise InputError(f"curve '{path}' is missing: {cannot}")
    table = read_parquet(path, lambda reason: InputError(f"curve '{path}' is not readable ({reason}): {cannot}"))
    if set(table.column_names) not in (set(CURVE_COLUMNS), set(CURVE_COLUMNS[:6])):  # the second: a run made before validation
        raise InputError(f"curve '{path}': expected the columns {list(CURVE_COLUMNS)}, got {table.column_names}: {cannot}")
    rows = [dict.fromkeys(CURVE_COLUMNS) | r for r in table.to_pylist() if r["update"] is not None and r["update"] <= done]
    if [r["update"] for r in rows] != list(range(1, done + 1)):
        raise InputError(f"curve '{path}' holds {len(rows)} of the updates 1..{done}: {cannot}")
    return rows


def wall_seconds(rows: list[dict[str, Any]], warm_start: dict[str, Any] | None) -> float:
    """The run's seconds so far: the last curve row's, or before update 1 the warm start's (0 without one)."""
    return rows[-1]["wall_seconds"] if rows else (warm_start or {}).get("seconds", 0.0)


def write_summary(
    out: Path,
    config: TrainerConfig,
    n: int,
    status: str,
    reason: str | None,
    updates_done: int,
    rows: list[dict[str, Any]],
    attempts: list[int],
    warm_start: dict[str, Any] | None = None,
    validation: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write training.json (with the warm start's and the validation's records when there are); returns its content."""
    summary = {
        "method": config.method,
        "n": n,
        "seed": config.seed,
        "status": status,
        "reason": reason,
        "updates_done": updates_done,
        "attempts": attempts,
        "final_cost10": rows[-1]["cost10"] if rows else None,
        "wall_seconds": wall_seconds(rows, warm_start),
        **({"warm_start": warm_start} if warm_start else {}),
        **({"validation": validation} if validation else {}),
        "manifest": manifest(config.to_dict()),
    }
    atomic_write_text(out / "training.json", json.dumps(summary, indent=1) + "\n")
    return summary


def ended_summary(out: Path, ckpt: dict[str, Any], config: TrainerConfig, n: int, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """For a run with nothing left to train (it diverged, or completed config.updates updates): its
    training.json, written anew only when missing or not of this checkpoint. None while there is training to do."""
    done, status = int(ckpt["trainer"]["update"]), ckpt["status"]
    if not (status == "diverged" or (status == "completed" and done == config.updates)):
        return None
    try:
        summary = json.loads((out / "training.json").read_text())
    except (OSError, ValueError):
        summary = None
    if isinstance(summary, dict) and summary.get("status") == status and summary.get("updates_done") == done:
        return summary
    trainer = ckpt["trainer"]
    validation = validation_record(config, trainer["validation"]) if trainer.get("validation") else None
    return write_summary(out, config, n, status, ckpt["reason"], done, rows, ckpt["attempts"], trainer.get("warm_start"), validation)


class Recorder(Protocol):
    """What a `RunAttempt` records of a run: RunRecorder on the process that writes the run folder, PeerRecorder
    on the other ranks of a data-parallel run."""

    def record(self, update: int, metrics: dict[str, float]) -> None:
        """Keep update `update`'s metrics (curve row, TensorBoard, progress bar)."""

    def validated(self, score: Score) -> None:
        """Keep a validation's score (TensorBoard)."""

    def write_curve(self) -> None:
        """Write curve.parquet with every update recorded so far."""

    def close(self) -> None:
        """End the progress bar and the TensorBoard writer."""

    def summary(self, status: str, reason: str | None, updates_done: int) -> dict[str, Any] | None:
        """Write training.json; returns its content, or None where this process does not write the run folder."""


class RunRecorder:
    """Curve rows, TensorBoard scalars and the progress bar of one run; `rows` are those of the updates already
    done, `attempts` the run's attempts so far (this one last); `method`'s records of its warm start (whose seconds
    start the wall clock) and of its validation go to training.json."""

    def __init__(
        self, out: Path, config: TrainerConfig, n: int, rows: list[dict[str, Any]], progress: bool, attempts: list[int], method: MethodRun
    ):
        from tensorboardX import SummaryWriter

        self.out, self.config, self.n, self.attempts, self.method = out, config, n, attempts, method
        self.rows = list(rows)
        done = len(self.rows)
        self.wall_offset = wall_seconds(self.rows, method.warm_start_record)
        self.start = time.perf_counter()
        # purge_step hides events of updates after the checkpoint that a killed run had logged
        self.writer = SummaryWriter(str(out / "tensorboard"), purge_step=done + 1 if done else None)
        self.bar = tqdm(total=config.updates, initial=done, desc=f"train {config.method} n={n}", disable=not progress)
        self.best = self.best_postfix()  # a resumed run's, from its checkpoint; then renewed at each validation

    def record(self, update: int, metrics: dict[str, float]) -> None:
        wall = self.wall_offset + time.perf_counter() - self.start
        self.rows.append(
            {
                "method": self.config.method,
                "n": self.n,
                "seed": self.config.seed,
                "update": update,
                "cost10": metrics["cost10"],
                "wall_seconds": wall,
                "validation_cost": metrics.get("validation_cost"),
                "restarted": metrics.get("restarted"),
            }
        )
        for key, value in metrics.items():
            if not key.startswith("validation_"):
                self.writer.add_scalar(f"train/{key}", value, update)
        self.bar.update(1)
        utilisation = {"mfu": f"{metrics['mfu']:.1%}"} if "mfu" in metrics else {}
        self.bar.set_postfix(cost10=f"{metrics['cost10']:.4g}", **utilisation, **self.best)

    def validated(self, score: Score) -> None:
        """TensorBoard's validation/cost and validation/se at `score`'s update, and the progress bar's best."""
        self.writer.add_scalar("validation/cost", score.cost, score.update)
        self.writer.add_scalar("validation/se", score.se, score.update)
        self.best = self.best_postfix()

    def best_postfix(self) -> dict[str, str]:
        """The progress bar's `best=COST@UPDATE` of the method's best network so far ({} before any)."""
        best = (self.method.validation_record or {}).get("best")
        return {"best": f"{best['cost']:.4g}@{best['update']}"} if best else {}

    def write_curve(self) -> None:
        write_curve(self.out, self.rows)

    def close(self) -> None:
        self.bar.close()
        self.writer.close()

    def summary(self, status: str, reason: str | None, updates_done: int) -> dict[str, Any]:
        """Write training.json; returns its content."""
        method = self.method
        return write_summary(
            self.out,
            self.config,
            self.n,
            status,
            reason,
            updates_done,
            self.rows,
            self.attempts,
            method.warm_start_record,
            method.validation_record,
        )


def write_curve(out: Path, rows: list[dict[str, Any]]) -> None:
    """Write curve.parquet of the curve rows `rows`."""
    write_parquet(
        pa.table(
            {
                "method": pa.array([r["method"] for r in rows], pa.string()),
                "n": pa.array([r["n"] for r in rows], pa.int64()),
                "seed": pa.array([r["seed"] for r in rows], pa.int64()),
                "update": pa.array([r["update"] for r in rows], pa.int64()),
                "cost10": pa.array([r["cost10"] for r in rows], pa.float64()),
                "wall_seconds": pa.array([r["wall_seconds"] for r in rows], pa.float64()),
                "validation_cost": pa.array([r["validation_cost"] for r in rows], pa.float64()),
                "restarted": pa.array([r["restarted"] for r in rows], pa.int64()),
            }
        ),
        out / "curve.parquet",
    )


class PeerRecorder:
    """The recorder of a data-parallel run's ranks other than 0: it keeps nothing, since rank 0 alone writes the run folder."""

    def record(self, update: int, metrics: dict[str, float]) -> None:
        pass

    def validated(self, score: Score) -> None:
        pass

    def write_curve(self) -> None:
        pass

    def close(self) -> None:
        pass

    def summary(self, status: str, reason: str | None, updates_done: int) -> None:
        return None


def failure_reason(what: str, error: Exception) -> str:
    """A failed run's reason, one line: what failed, the exception's type and its message's first line."""
    message = first_line(error) if str(error).strip() else ""
    return f"{what} failed: {type(error).__name__}: {message}"


class StopRequest:
    """`with StopRequest() as stop:` in the main thread: the first Ctrl-C or SIGTERM only sets `stop.requested`
    (the loop stops when the current update is done, so no half-made update is ever saved); a second one
    raises KeyboardInterrupt at once. Elsewhere (a worker thread) it changes nothing."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.requested = False
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self.previous[sig] = signal.signal(sig, self.request)
        return self

    def request(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        try:
            os.write(2, b"\nstopping after this update to save it (once more to stop at once without saving it)\n")
        except OSError:  # no stderr: stop all the same
            pass

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


# ---- a run's life, for every method ----------------------------------------------------------------


class RunStart(NamedTuple):
    """Where a training attempt starts: the run folder's checkpoint (None: anew), the curve rows of its updates,
    and training.json's content when the run has ended (nothing left to train)."""

    checkpoint: dict[str, Any] | None
    rows: list[dict[str, Any]]
    ended: dict[str, Any] | None


def run_start(out: Path, config: TrainerConfig, instance: Instance) -> RunStart:
    """The start that the run folder `out` offers: its checkpoint.pt, checked against this run's config and
    instance, with its curve (module docstring), or anew when it holds no checkpoint."""
    path = out / LAST
    if not path.is_file():
        return RunStart(None, [], None)
    ckpt = read_checkpoint(path)
    check_resumable(ckpt, config, instance, path)
    rows = read_curve(out / "curve.parquet", int(ckpt["trainer"]["update"]))
    return RunStart(ckpt, rows, ended_summary(out, ckpt, config, instance.n, rows))


class Trainer(Protocol):
    """What a run's loop drives: the trainer a method builds (`MethodRun.build`)."""

    update: int
    """Updates done (the next one is update + 1)."""

    def step(self) -> dict[str, float]:
        """One update; its metrics (with cost10)."""

    def diverged(self, metrics: dict[str, float]) -> str | None:
        """Why the run has diverged after an update with these metrics, or None."""


class MethodRun(ABC):
    """The method-specific parts of a run's life (`RunAttempt`): what is checked before the folder is made, how
    the trainer is built (anew or from a checkpoint), warm-started and saved."""

    checkpoint_every: int
    """Updates between periodic checkpoints (0: only at the end); set by each method's constructor."""

    @property
    def lead(self) -> bool:
        """Whether this process writes the run folder (rank 0 of a data-parallel run; a run in one process: always)."""
        return True

    @property
    def saves_after_failure(self) -> bool:
        """Whether an update that raised left the trainer as it was after the last finished update, so that the run
        can be saved there."""
        return False

    @property
    def warm_start_record(self) -> dict[str, Any] | None:
        """The record of the run's warm start once there is one (training.json and the checkpoint hold it); None
        for a method without a warm start."""
        return None

    def check(self) -> None:
        """Check the inputs the config names (files) before a run that starts anew makes its folder."""

    @abstractmethod
    def build(self, out: Path, checkpoint: dict[str, Any] | None) -> Trainer:
        """The trainer, made in the run folder `out`: anew, or continuing `checkpoint` (trainers.checkpoint)."""

    def warm_start(self, progress: bool = False, after_update: Callable[[int], bool] | None = None) -> bool:
        """Make the warm start when one is due (before the run's first update), with progress bars if `progress`,
        calling `after_update(updates done)` after each of its updates but the last, and stopping when it returns
        True; returns whether the warm start is done."""
        return False

    def describe(self) -> str | None:
        """A line about how the built trainer runs (e.g. its micro-batches), printed before training with progress."""
        return None

    def validate(self, last: int) -> Score | None:
        """Score the current network on the validation set where it is due (trainers.model_selection.due, `last` the
        run's last update) and not scored yet, keeping the best network; on the lead process only. None where
        nothing was scored (always, for a method that does not validate)."""
        return None

    @property
    def validation_record(self) -> dict[str, Any] | None:
        """training.json's `validation` (trainers.model_selection.Validation.record); None for a method that does not validate."""
        return None

    @abstractmethod
    def checkpoint_state(self) -> dict[str, Any]:
        """The trainer's state for checkpoint.pt at its update (called on every process), after writing whatever the
        method keeps beside it. curve.parquet of this update is already on disk."""

    def after_checkpoint(self) -> None:
        """Called on every process once checkpoint.pt of the update is written (by the lead)."""

    def close(self) -> None:
        """Release what `build` holds."""


@contextmanager
def open_run(
    out_dir: str | os.PathLike, mode: str, config: TrainerConfig, instance: Instance, method: MethodRun
) -> Iterator[tuple[Path, RunStart]]:
    """`with open_run(...) as (out, start):` checks the run folder for `mode` and, for a run that starts anew, the method's inputs, before
    anything is written; then prepares the folder (`start_run_dir`) and reads where training starts. A folder it made that the block
    leaves empty is removed. `out` is absolute: Ray's storage, RLlib's checkpoints and Ray Train workers (they change directory) need it."""
    check_run_dir(out_dir, mode)
    if mode != "resume":
        method.check()
    made = not Path(out_dir).exists()
    out = start_run_dir(out_dir, mode).resolve()
    try:
        yield out, run_start(out, config, instance)
    finally:
        if made and out.is_dir() and not any(out.iterdir()):
            out.rmdir()


class RunAttempt:
    """One training attempt of a run from `start` (module docstring): build the trainer, warm-start it when due,
    then update it to config.updates, saving the curve and the checkpoint every checkpoint_every updates and at the
    end. One StopRequest serves the warm start and the updates. The attempt is recorded in the checkpoint and in
    training.json's `attempts`: the update each attempt started from."""

    def __init__(
        self,
        out: Path,
        config: TrainerConfig,
        instance: Instance,
        start: RunStart,
        method: MethodRun,
        progress: bool = True,
        on_update: OnUpdate = None,
    ):
        self.out, self.config, self.instance, self.start, self.method = out, config, instance, start, method
        self.progress, self.on_update = progress, on_update
        self.attempts: list[int] = []
        self.stop = StopRequest()
        self.recorder: Recorder = PeerRecorder()
        self.stopped_warm_start = False

    def run(self) -> dict[str, Any] | None:
        """Train; returns training.json's content (at once when the run has ended; None on the processes other than
        the lead). `on_update(update, metrics)` is called after each update."""
        if self.start.ended is not None:
            return self.start.ended
        config, method = self.config, self.method
        trainer = method.build(self.out, self.start.checkpoint)
        if self.progress and method.lead and (line := method.describe()):
            tqdm.write(line, file=sys.stderr)
        self.attempts = [*(self.start.checkpoint["attempts"] if self.start.checkpoint else []), trainer.update]
        with self.stop:
            warm_started = self.warm_start(trainer)
            if method.lead:
                if self.start.checkpoint is None:  # the events of an attempt that stopped before its first checkpoint go
                    shutil.rmtree(self.out / "tensorboard", ignore_errors=True)
                self.recorder = RunRecorder(self.out, config, self.instance.n, self.start.rows, self.progress, self.attempts, method)
            if score := method.validate(config.updates):  # the network the run starts from (update 0)
                self.recorder.validated(score)
            if warm_started:  # the update-0 checkpoint: a resume neither repeats nor skips the warm start
                self.save("running", None)
            status, reason, update = "completed", None, trainer.update
            try:
                while update < config.updates and not self.stop.requested:
                    try:
                        metrics = trainer.step()
                    except Exception as error:
                        if method.saves_after_failure:
                            reason = failure_reason(f"update {update + 1}", error)
                            self.save("failed", reason)
                            self.recorder.summary("failed", reason, update)
                        raise
                    update += 1
                    if score := method.validate(config.updates):
                        metrics = {**metrics, "validation_cost": score.cost, "validation_se": score.se}
                        self.recorder.validated(score)
                    self.recorder.record(update, metrics)
                    if self.on_update is not None:
                        self.on_update(update, metrics)
                    if reason := trainer.diverged(metrics):
                        status = "diverged"
                        break
                    if method.checkpoint_every and update % method.checkpoint_every == 0:
                        self.save("running", None)
                if status == "completed" and update < config.updates:
                    status = "interrupted"
                self.save(status, reason)
            finally:
                self.recorder.close()
            summary = self.recorder.summary(status, reason, update)
        if self.stop.requested:
            raise KeyboardInterrupt
        return summary

    def warm_start(self, trainer: Trainer) -> bool:
        """The method's warm start when due; returns whether one was made. An exception marks its last checkpoint
        `failed`; an interruption saves it `interrupted` and raises KeyboardInterrupt."""
        method = self.method
        try:
            warm_started = method.warm_start(self.progress and method.lead, self.after_imitation_update)
        except Exception as error:  # e.g. out of memory: the last checkpoint of the warm start says so
            if method.lead and (self.out / LAST).exists():
                reason = failure_reason("the warm start", error)
                last = read_checkpoint(self.out / LAST)
                save_checkpoint(self.out / LAST, self.config, self.instance, last["trainer"], "failed", reason, last["attempts"])
                write_summary(self.out, self.config, self.instance.n, "failed", reason, trainer.update, self.start.rows, self.attempts)
            raise
        if self.stopped_warm_start:
            if method.lead:
                write_summary(self.out, self.config, self.instance.n, "interrupted", None, trainer.update, self.start.rows, self.attempts)
            raise KeyboardInterrupt
        return warm_started

    def after_imitation_update(self, done: int) -> bool:
        """Save the warm start under way every checkpoint_every imitation updates and when asked to stop; returns
        whether to stop."""
        self.stopped_warm_start = self.stop.requested
        every = self.method.checkpoint_every
        if self.stopped_warm_start or (every and done % every == 0):
            if self.method.lead:
                write_curve(self.out, self.start.rows)
            self.write_checkpoint("interrupted" if self.stopped_warm_start else "running", None)
        return self.stopped_warm_start

    def save(self, status: str, reason: str | None) -> None:
        """Save the run at its update, curve.parquet first, then checkpoint.pt: a checkpoint never names an update that
        the curve on disk lacks."""
        self.recorder.write_curve()
        self.write_checkpoint(status, reason)

    def write_checkpoint(self, status: str, reason: str | None) -> None:
        """checkpoint.pt of the method's state (and best.pt first, where the validation names a best network: checkpoint.pt
        never names a best not on disk), written by the lead; then the method's `after_checkpoint`."""
        state = self.method.checkpoint_state()
        if self.method.lead:
            config, instance = self.config, self.instance
            if best := (state.get("validation") or {}).get("best"):
                kept = [a for a in self.attempts if a <= best["update"]] or [0]
                save_checkpoint(self.out / BEST, config, instance, best_network_state(best), status, reason, kept)
            save_checkpoint(self.out / LAST, config, instance, state, status, reason, self.attempts)
        self.method.after_checkpoint()


def train_run(
    out_dir: str | os.PathLike,
    mode: str,
    config: TrainerConfig,
    instance: Instance,
    method: MethodRun,
    progress: bool = True,
    on_update: OnUpdate = None,
) -> dict[str, Any]:
    """A run's life in this process: `open_run`, then a `RunAttempt`; returns training.json's content."""
    with open_run(out_dir, mode, config, instance, method) as (out, start):
        try:
            return RunAttempt(out, config, instance, start, method, progress, on_update).run()
        finally:
            method.close()
