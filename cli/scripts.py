"""What every script in platform/ shares at its boundary: its parser (`script_parser`), argument types, the flags of
held-out evaluation, and `run_cli`, which reports bad input (`InputError`, a bad flag included) as one line
`error: ...` with exit status 2, on a line of its own after a progress bar's output, and an interruption as one line
with exit status 130. Any other exception is a bug and keeps its traceback. Input files are read, and
output folders checked, by plumbing.files."""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import time
from collections.abc import Callable

from cli.output_folders import out_argument
from demand.bootstrap import REPLICATES_MAX
from envs.instance import FACTORS_MAX, OVERDISPERSION_MAX
from plumbing import validate
from plumbing.errors import InputError, Interrupted
from plumbing.validate import DECIMAL_INTEGER, NUMBER_LITERAL
from trainers.policy import MODES, PRECISIONS

INTERRUPTED_EXIT = 130


class ScriptParser(argparse.ArgumentParser):
    """A script's parser: a bad or missing flag is an InputError (one `error:` line and exit status 2 under
    `run_cli`), not argparse's usage block and `prog: error:` line."""

    def error(self, message: str):
        raise InputError(f"{message} (see {self.prog} --help)")


def script_parser(description: str) -> ScriptParser:
    """The parser of a script in platform/, its help text `description` (the module docstring) kept as written."""
    return ScriptParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)


def _flag(check: Callable, **bounds) -> Callable[[str], object]:
    """An argparse type: the flag's text checked by the validator `check` (plumbing.validate), as a number
    when it is written as one (a whole number written as 1e9 or 2.0 is that integer, so that a count's limits, not its
    spelling, decide); argparse prefixes the message with the flag's name."""

    def parse(text: str):
        value = int(text) if DECIMAL_INTEGER.fullmatch(text.strip()) else float(text) if NUMBER_LITERAL.fullmatch(text.strip()) else text
        if check is validate.integer and isinstance(value, float) and value.is_integer():
            value = int(value)
        return check(value, "", **bounds, error=argparse.ArgumentTypeError)

    return parse


positive_int = _flag(validate.integer, low=1)
non_negative_int = _flag(validate.integer, low=0)


def replicates(text: str) -> int:
    """A count of bootstrap replicates: an integer in [2, REPLICATES_MAX] (a standard error needs two; beyond the maximum its
    own error no longer shrinks what the report shows, demand.bootstrap.REPLICATES_MAX)."""
    refused = argparse.ArgumentTypeError(
        f"expected an integer >= 2 (a standard error needs two replicates) and at most {REPLICATES_MAX:,} (a standard error's own "
        f"relative error is about 1/sqrt(2 R), 0.2% there, and every replicate refits the model), got {text}"
    )
    try:
        value = positive_int(text)
    except argparse.ArgumentTypeError:
        raise refused from None
    if not 2 <= value <= REPLICATES_MAX:
        raise refused
    return value


def learned_policy_flags(parser: argparse.ArgumentParser, which: str) -> None:
    """--mode and --precision, one help text each for every script that runs a learned policy (`which`: how that script
    names it, e.g. checkpoint:PATH or --checkpoint); a named policy refuses a precision other than float32."""
    parser.add_argument("--mode", default="greedy", choices=MODES, help=f"for {which}: greedy or sampled opening (default greedy)")
    parser.add_argument(
        "--precision",
        default="float32",
        choices=PRECISIONS,
        help=f"for {which} of or-transformer or hpo: the networks' arithmetic, bfloat16 autocast or float32 (default float32)",
    )


def ray_address(text: str) -> str:
    """The argparse type of --address: the text as given, refused when it is empty (an unset variable), which would
    otherwise start an embedded Ray instead of joining the cluster the user meant."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"expected a Ray cluster address (HOST:PORT, ray://HOST:PORT or auto), got {text!r} (an empty address, as an unset "
            "variable gives, would start an embedded Ray instead of joining a cluster; leave --address out for that)"
        )
    return text


positive_real = _flag(validate.real, low=0.0, low_open=True)
non_negative_real = _flag(validate.real, low=0.0)
port = _flag(validate.integer, low=1, high=65535)
seed = _flag(validate.seed)
"""A random seed in [0, 2^31 - 1] (plumbing.validate.SEED_MAX)."""
horizon = _flag(validate.horizon)
time_limit = _flag(validate.time_limit)
mip_gap = _flag(validate.mip_gap)
scenarios = _flag(validate.scenarios)
factors = _flag(validate.integer, low=1, high=FACTORS_MAX, why="an instance has at most that many factors")
"""A number of common factors k in [1, FACTORS_MAX] (envs.instance)."""
overdispersion = _flag(validate.real, low=0.0, high=OVERDISPERSION_MAX)
"""An overdispersion phi in [0, OVERDISPERSION_MAX] (envs.instance)."""


def held_out_flags(parser: argparse.ArgumentParser, solver_pool: bool) -> None:
    """The flags of the scripts that evaluate a policy or a bound on held-out episodes (evaluate.py, and with
    `solver_pool` milp.py and bound.py, which also take --workers and --address), one help text each: --episodes,
    --horizon, --seed (of the exogenous paths, the held-out set's by default), --out and --overwrite."""
    from envs.evaluation import EVAL_HORIZON  # imports torch: only once the script parses its flags
    from envs.exogenous import HELDOUT_EPISODES, HELDOUT_SEED

    parser.add_argument("--episodes", type=positive_int, default=HELDOUT_EPISODES, help=f"episodes (default {HELDOUT_EPISODES})")
    parser.add_argument("--horizon", type=horizon, default=EVAL_HORIZON, help=f"decisions per episode (default {EVAL_HORIZON})")
    parser.add_argument("--seed", type=seed, default=HELDOUT_SEED, help=f"exogenous-path seed (default: held-out {HELDOUT_SEED})")
    if solver_pool:
        parser.add_argument("--workers", type=positive_int, default=2, help="solver-worker actors (default 2)")
        parser.add_argument("--address", type=ray_address, help="Ray cluster address (default: RAY_ADDRESS, else an embedded Ray)")
    parser.add_argument("--out", type=out_argument, required=True, help="output directory")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace a run that --out holds (all its files, whatever its kind) instead of refusing it"
    )


def device(text: str) -> str:
    """A torch device the scripts run on: cpu, cuda or cuda:K (CUDA only where it is available)."""
    import torch

    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:K, got '{text}'")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(f"'{text}': CUDA is not available on this machine (use cpu)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise argparse.ArgumentTypeError(
                f"'{text}': this machine has {torch.cuda.device_count()} CUDA devices (0..{torch.cuda.device_count() - 1})"
            )
    return text


def _terminate(signum, frame):
    raise KeyboardInterrupt


def _stop_starting(signum, frame):
    os.write(2, b"interrupted: stopped while starting, before any work; nothing was written\n")
    os._exit(INTERRUPTED_EXIT)


def interrupt_start_up() -> None:
    """Call first in a script whose imports take seconds (torch, Ray): until `run_cli` takes over, Ctrl-C or
    SIGTERM ends it at once with one line `interrupted: ...` and exit status 130 (nothing has been written)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _stop_starting)


LOG_FRAME_SECONDS = 30.0
"""Into a log (a stream that is not a terminal) a progress bar's frames go as lines, at most one per this many seconds,
and its last frame."""


class LineTracking:
    """A text stream that passes every write on to `stream` and knows whether its output ends a line: a progress bar
    leaves its last frame after a carriage return, and the line `run_cli` prints then has to start a new one (so that
    `grep '^error:'` finds it). When `stream` is not a terminal (a log file, `ray job logs`), a bar's frames (writes
    that start with a carriage return) become lines, the first at once and then at most one per LOG_FRAME_SECONDS, and the
    frame a bar ends on is written before whatever follows it, instead of ten frames a second on one endless line."""

    def __init__(self, stream):
        self.stream = stream
        self.at_line_start = True
        self.terminal = bool(getattr(stream, "isatty", lambda: False)())
        self.held: str | None = None
        self.shown = -math.inf

    def write(self, text: str) -> int:
        written = len(text)
        if not text:
            return 0
        if self.terminal:
            self.at_line_start = text.endswith("\n")
            return self.stream.write(text)
        if text.startswith("\r") and "\n" not in text:  # a bar's frame
            frame = text.strip()
            self.held = frame or None
            if frame and (now := time.monotonic()) - self.shown >= LOG_FRAME_SECONDS:
                self._emit(frame + "\n")
                self.held, self.shown = None, now
            return len(text)
        if self.held is not None:  # the bar's last frame, then what follows it (the newline that ended the bar)
            self._emit(self.held + "\n")
            self.held, text = None, text.removeprefix("\n")
        if text:
            self._emit(text)
        return written

    def _emit(self, text: str) -> None:
        self.at_line_start = text.endswith("\n")
        self.stream.write(text)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def _report(kind: str, message: str = "") -> None:
    """One line `kind: message` (or `kind`) on stderr, after a newline if the output so far ends mid-line."""
    stream = sys.stderr
    start = "" if getattr(stream, "at_line_start", True) else "\n"
    print(f"{start}{kind}: {message}" if message else f"{start}{kind}", file=stream)


def count(number: int, noun: str) -> str:
    """`number` `noun`s for a script's line: "1 window", "3 windows"."""
    return f"{number} {noun}" + ("" if number == 1 else "s")


def run_cli(main: Callable[[], int | None]) -> None:
    """Run a script's main. SIGTERM is treated like Ctrl-C, so a script can save its work either way."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _terminate)
    if not isinstance(sys.stderr, LineTracking):
        sys.stderr = LineTracking(sys.stderr)
    try:
        sys.exit(main() or 0)
    except InputError as exc:
        _report("error", str(exc))
        sys.exit(2)
    except Interrupted as exc:
        _report("interrupted", str(exc))
        sys.exit(INTERRUPTED_EXIT)
    except KeyboardInterrupt:
        _report("interrupted")
        sys.exit(INTERRUPTED_EXIT)
