import copy
import hashlib
import inspect
import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from envs.instance import Instance, paper_instance

if "ATEN_CPU_CAPABILITY" in os.environ and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    # Inductor's caches of compiled kernels are not keyed by the ATen capability: code compiled for this CPU's vector
    # instructions would be reused under ATEN_CPU_CAPABILITY=default, whose headers lack them (a C++ compile error)
    capability = os.environ["ATEN_CPU_CAPABILITY"]
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(tempfile.gettempdir()) / f"torchinductor-{os.getuid()}-{capability}")


def pytest_addoption(parser):
    parser.addoption(
        "--torch-threads",
        type=int,
        default=None,
        help="torch intra-op threads of the test process (default: torch's own choice); `make test-portability` runs 1 and 2",
    )


def pytest_configure(config):
    threads = config.getoption("--torch-threads")
    if threads is not None:
        if threads < 1:
            raise pytest.UsageError(f"error: --torch-threads: expected an integer >= 1, got {threads}")
        torch.set_num_threads(threads)


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs CUDA")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


ROOT = Path(__file__).resolve().parent.parent


SCRIPT_IMPORTS = [
    "torch",
    "pyarrow.parquet",
    "cli.scripts",
    "envs.evaluation",
    "run_results.records",
    "trainers.registry",
    "trainers.experiment",
    "trainers.rllib_ppo",
    "solver_workers.solver_run",
    "sweeps.runner",
    "serving.decisions",
    "pytest",
]
"""What the scripts import, loaded once by the fork server that run_script's processes come from (a new interpreter
spends 2-4 s importing them); and pytest, which each of these processes imports again as the test process's __main__
(multiprocessing runs the parent's main module, pytest's, in each child before its target: 0.1 s a process)."""

SCRIPT_SECONDS = 300


def run_script(name: str, *args, check: bool = False) -> subprocess.CompletedProcess:
    """Run platform/<name> as a user would from the command line (`python platform/<name> args` in the test process's
    working folder): a fresh process, forked from a server that has imported SCRIPT_IMPORTS; killed after
    SCRIPT_SECONDS. `check`: assert that it exited with 0. Its environment is the server's, the test process's when
    the server started: one that the script sets again would disagree with what its imports read (Ray's
    RAY_AUTH_MODE, set by ray.init, is read when ray is imported)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(SCRIPT_IMPORTS)  # takes effect when the server starts, at the first call
    path, argv = str(ROOT / "platform" / name), [str(a) for a in args]
    with tempfile.TemporaryDirectory(prefix="script-") as logs:
        stdout, stderr, status = (os.path.join(logs, f) for f in ("out", "err", "status"))
        process = context.Process(target=script_as_main, args=(path, argv, os.getcwd(), stdout, stderr, status))
        process.start()
        process.join(timeout=SCRIPT_SECONDS)
        if process.exitcode is None:
            process.kill()
            process.join()
        code = int(Path(status).read_text()) if os.path.isfile(status) else process.exitcode
        result = subprocess.CompletedProcess([name, *argv], code, Path(stdout).read_text(), Path(stderr).read_text())
    if check:
        assert result.returncode == 0, result.stderr[-2000:]
    return result


def script_as_main(path: str, args: list[str], cwd: str, stdout: str, stderr: str, status: str) -> None:
    """In a child of the fork server: the script as `python path args` runs it (its folder first on sys.path, its
    argv, run as __main__, in the caller's working folder `cwd`), with stdout and stderr in the two files. The exit
    status (SystemExit's code; an uncaught exception prints its traceback and gives 1) is also written to `status`:
    the fork server's own report of it can be lost (multiprocessing then gives 255)."""
    for fd, name in ((1, stdout), (2, stderr)):
        target = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    os.chdir(cwd)
    sys.argv = [path, *args]
    sys.path.insert(0, os.path.dirname(path))
    code = 1
    try:
        runpy.run_path(path, run_name="__main__")
        code = 0
    except SystemExit as stop:
        code = 0 if stop.code is None else stop.code if isinstance(stop.code, int) else 1
        raise
    finally:
        Path(status).write_text(str(code))


@pytest.fixture(scope="module")
def one_torch_thread():
    """A module of small tensor checks runs on one torch thread (the same numbers, and no thread contention on a busy
    machine); the count is restored afterwards. Use it as `pytestmark = pytest.mark.usefixtures("one_torch_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def single_item(lead: int, lam: float = 2.0, h: float = 1.0, b: float = 10.0, K: float = 5.0, qbar: float = 12.0) -> Instance:
    return Instance(h=[h], b=[b], lam=[lam], beta=[0.0], lead=[lead], qbar=[qbar], K=K, gamma=0.9, rho=0.5)


@pytest.fixture(scope="session")
def ray_session():
    """One embedded Ray for the whole test session, started and bound as the scripts start theirs. Every test
    that uses Ray in the test process asks for it (tests without it must not start Ray: `no_stray_ray`)."""
    import ray

    from ray_access.session import start_local_ray

    start_local_ray(2, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(autouse=True)
def no_stray_ray(request):
    """A test that does not ask for `ray_session` must not start a Ray of its own in the test process."""
    ray = sys.modules.get("ray")
    before = ray is not None and ray.is_initialized()
    yield
    ray = sys.modules.get("ray")
    if "ray_session" not in request.fixturenames and not before and ray is not None and ray.is_initialized():
        pytest.fail("this test started Ray in the test process: ask for the ray_session fixture instead")


@pytest.fixture(scope="session")
def tuned():
    """policies.classical.tuned_policy, tuned once per session for each instance, name, horizon and options (tuning is
    deterministic and takes seconds; an option given at its default is the call without it); each call gets a copy of
    the policy (a tuned policy may hold a clock)."""
    from policies.classical import tuned_policy

    cache = {}
    defaults = {k: p.default for k, p in inspect.signature(tuned_policy).parameters.items() if p.default is not inspect.Parameter.empty}

    def tuned_once(instance, name, rules, horizon, **options):
        options = defaults | options
        key = (instance.content_hash(), name, horizon, tuple(sorted((k, str(v)) for k, v in options.items())))
        if key not in cache:
            cache[key] = tuned_policy(instance, name, rules, horizon, **options)
        policy, parameters = cache[key]
        return copy.copy(policy), dict(parameters)

    return tuned_once


# ---- the tiny trained runs that the tests share -------------------------------------------------------

METHODS = ("or-transformer", "hpo", "ppo", "transformer-ppo")
INSTANCE = paper_instance(2, 0)
"""The instance of the shared runs (lead times [3, 3], qbar [24.8, 22.4])."""
TINY = dict(batch=8, rollout=3, blocks=1, width=16, heads=2, feed_forward=32, hidden=16)
"""The one tiny config of the tests (over the cpu preset): 8 rollouts of 3 steps per update, a one-block network
of width 16. A test that needs another size says which fields differ ({**TINY, ...})."""
UPDATES = 2
"""The shared runs' updates."""
WARM_START = {
    "or-transformer": {"imitation_updates": 3, "imitation_dagger_updates": 1, "imitation_teacher": "base-stock"},
    "hpo": {"imitation_updates": 0},
}
"""The cpu preset's warm starts shortened: OR-Transformer's (300 plain and 1,000 DAgger updates imitating the
decomposition lookahead) to 3 plain and 1 DAgger update imitating base-stock (one family to tune); HPO's (300
imitating classical-best) skipped."""
EPISODES, HORIZON = 4, 5
"""The shared runs' held-out evaluation."""


def tiny(method: str) -> dict:
    """The shared runs' overrides of the cpu preset for `method`: TINY, UPDATES updates, and a pathwise method's
    warm start shortened (WARM_START; an RLlib method has none)."""
    return {**TINY, "updates": UPDATES, **WARM_START.get(method, {})}


@dataclass(frozen=True)
class TrainedRun:
    folder: Path
    result: dict[str, Any]
    """run_experiment's answer: training.json's content and the greedy and sampled summaries."""
    calls: list
    """(update, metrics) of every on_update call."""

    @property
    def checkpoint(self) -> Path:
        return self.folder / "checkpoint.pt"


def digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="session")
def trained(tmp_path_factory, ray_session) -> dict[str, TrainedRun]:
    """Every method trained once per session by trainers.experiment.run_experiment on INSTANCE with tiny(method)
    (preset cpu, seed 0), evaluated on EPISODES x HORIZON held-out steps. Read-only: a test that changes a run
    copies its folder first (checked when the session ends)."""
    from trainers.experiment import run_experiment

    folder = tmp_path_factory.mktemp("trained")
    runs = {}
    for method in METHODS:
        calls = []
        result = run_experiment(
            method,
            INSTANCE,
            folder / method,
            overrides=tiny(method),
            episodes=EPISODES,
            horizon=HORIZON,
            progress=False,
            on_update=lambda update, metrics, calls=calls: calls.append((update, metrics)),
        )
        runs[method] = TrainedRun(folder / method, result, calls)
    written = digests(folder)
    yield runs
    assert digests(folder) == written, "a test changed a shared trained run: copy its folder first"


OPEN_MARGIN = 1e-4
"""The same policy on the same state computes p in float32 along different paths (a batch of other states, decide.py
against the networks called here, the service's merged batch), which can differ in the last bits; where |p - 0.5| is
below this margin two paths may take different greedy openings Y = 1{p > 0.5}, and a test compares Y only elsewhere."""


def clear_of_one_half(p) -> np.ndarray:
    """Which of the probabilities `p` are far enough from 0.5 (OPEN_MARGIN) that no rounding flips their greedy opening."""
    return np.abs(np.asarray(p, dtype=float) - 0.5) > OPEN_MARGIN
