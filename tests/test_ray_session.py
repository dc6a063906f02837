"""init_ray: the embedded Ray listens on loopback only and leaves no token in ~/.ray; its next start ends what the
embedded Ray of a killed driver left running, and nothing else; an address where no Ray cluster answers is refused
within seconds as bad input, without starting Ray. The cases run in interpreters of their own: the session's Ray
(`ray_session`) must neither collide with them nor satisfy them."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT
from helpers import is_loopback, machine_addresses, poll_listeners, reachable

from ray_access.session import SESSION_RECORD, end_dead_sessions, process_start, session_processes

EMBEDDED = """
import os, sys, ray
from ray_access.session import init_ray

init_ray(1)

@ray.remote
def task_pid():
    return os.getpid()

@ray.remote
class Actor:
    def pid(self):
        return os.getpid()

ray.get([task_pid.remote(), Actor.remote().pid.remote()])  # a task worker and an actor worker are up
print("ready", flush=True)
sys.stdin.read()
ray.shutdown()
"""

CONNECT = """
import json, os, sys, ray
from ray_access.session import init_ray

for address, ray_address in json.loads(sys.argv[1]):
    os.environ.pop("RAY_ADDRESS", None)
    if ray_address:
        os.environ["RAY_ADDRESS"] = ray_address
    try:
        init_ray(1, address or None)
        error = None
    except Exception as exc:
        error = f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"
    print(json.dumps({"error": error, "started": ray.is_initialized()}), flush=True)
"""

RAY_ENV = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")  # what the session's Ray may have set


def clean_env(home: Path, **extra: str) -> dict:
    """This environment without Ray's settings, with a fresh HOME (so ~/.ray is visible to the test)."""
    return {**{k: v for k, v in os.environ.items() if k not in RAY_ENV}, "HOME": str(home), **extra}


def seen_ray(listeners: set) -> bool:
    """The GCS, the raylet and a worker each hold a listening socket in the union of the reads."""
    names = {name for name, _, _ in listeners}
    return {"gcs_server", "raylet"} <= names and any(name.startswith("ray::") for name in names)


@pytest.mark.skipif(not Path("/proc/net/fib_trie").exists(), reason="reads listening sockets and addresses from Linux /proc")
def test_embedded_ray_listens_on_loopback_only_and_writes_no_token_to_home(tmp_path):
    """Every listening socket of the embedded Ray's processes (the union of repeated reads of /proc/net/tcp{,6},
    until the GCS, the raylet and a worker have been seen) is bound to loopback, and a connection to each of
    their ports on every other address of this machine is refused. Breaks if any Ray process binds 0.0.0.0, ::
    or a machine address, or if ~/.ray receives a token."""
    log = (tmp_path / "driver.log").open("w")
    driver = subprocess.Popen(
        [sys.executable, "-c", EMBEDDED],
        cwd=ROOT,
        env=clean_env(tmp_path),
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
    )
    try:
        assert driver.stdout.readline().strip() == "ready", (tmp_path / "driver.log").read_text()[-3000:]
        listeners = poll_listeners(driver.pid, seen_ray)
        others = machine_addresses()
        answered = [
            (address, port) for address in others for port in sorted({port for _, _, port in listeners}) if reachable(*address, port)
        ]
        driver.stdin.close()
        assert driver.wait(timeout=60) == 0, (tmp_path / "driver.log").read_text()[-3000:]
    finally:
        driver.kill()
        log.close()
    assert seen_ray(listeners), listeners  # the check saw Ray
    assert [(name, address) for name, address, _ in listeners if not is_loopback(address)] == []
    assert others, "this machine has no address but loopback: nothing to connect to"
    assert answered == []
    assert not (tmp_path / ".ray" / "auth_token").exists()


def free_port() -> int:
    """A TCP port where nothing listens on any address (chosen by the OS, then released)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


NO_GCS_ADDRESS = [
    ("ray://127.0.0.1:10001", "Ray Client and URL addresses are not supported"),
    ("headnode", "expected HOST:PORT"),
    ("127.0.0.1:99999", "expected HOST:PORT"),
]


@pytest.fixture(scope="module")
def refusals(tmp_path_factory) -> dict[tuple[str, str], dict]:
    """init_ray(1, address or None) for every case below, one after the other in one fresh interpreter (none
    starts Ray, so each meets the state the one before it found): {(address, RAY_ADDRESS): {error, started}}, and
    under "nothing listens" the two addresses where nothing listened, chosen just before the interpreter starts."""
    nothing_listens = {"flag": f"127.0.0.1:{free_port()}", "RAY_ADDRESS": f"127.0.0.1:{free_port()}"}
    cases = [("", nothing_listens["RAY_ADDRESS"]), (nothing_listens["flag"], ""), *((address, "") for address, _ in NO_GCS_ADDRESS)]
    result = subprocess.run(
        [sys.executable, "-c", CONNECT, json.dumps(cases)],
        cwd=ROOT,
        env=clean_env(tmp_path_factory.mktemp("home")),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return {**dict(zip(cases, map(json.loads, result.stdout.splitlines()))), "nothing listens": nothing_listens}


@pytest.mark.parametrize("via_env", [False, True], ids=["flag", "RAY_ADDRESS"])
def test_an_address_where_nothing_listens_is_refused_without_starting_ray(refusals, via_env):
    address = refusals["nothing listens"]["RAY_ADDRESS" if via_env else "flag"]
    result = refusals[("", address) if via_env else (address, "")]
    where = f"RAY_ADDRESS={address}" if via_env else f"--address {address}"
    assert re.fullmatch(rf"plumbing\.errors\.InputError: {re.escape(where)}: no Ray cluster answers there \(.+\)", result["error"]), result
    assert not result["started"]


@pytest.mark.parametrize("address, message", NO_GCS_ADDRESS)
def test_an_address_that_is_no_gcs_address_is_refused(refusals, address, message):
    result = refusals[(address, "")]
    assert result["error"].startswith(f"plumbing.errors.InputError: --address {address}: {message}"), result
    assert not result["started"]


def test_the_processes_of_a_dead_embedded_session_are_ended_and_no_others(tmp_path):
    """end_dead_sessions kills exactly the processes that hold a file open in a dead session's folder and name its
    node or raylet: not a Ray process of the same node elsewhere, not a non-Ray process reading its logs, not the
    processes of a session whose driver runs (here: this test)."""
    driver = subprocess.Popen(["sleep", "60"])
    driver_start = process_start(driver.pid)
    driver.kill()
    driver.wait()
    sessions = {"dead": (driver.pid, driver_start, "deadnode"), "live": (os.getpid(), process_start(os.getpid()), "livenode")}
    for name, (pid, start, node) in sessions.items():
        (tmp_path / f"session_{name}" / "logs").mkdir(parents=True)
        (tmp_path / f"session_{name}" / SESSION_RECORD).write_text(
            json.dumps({"driver_pid": pid, "driver_start": start, "node_id": node, "raylet_pid": 4_000_000 + len(name)})
        )
    cases = {  # (session whose log is the process's stdout, environment): ended?
        "agent of the dead session": ("dead", {"RAY_NODE_ID": "deadnode"}, True),
        "worker of the dead session": ("dead", {"RAY_RAYLET_PID": str(4_000_004)}, True),
        "same node id, no file of the session": (None, {"RAY_NODE_ID": "deadnode"}, False),
        "a reader of the dead session's log": ("dead", {}, False),
        "agent of the live session": ("live", {"RAY_NODE_ID": "livenode"}, False),
    }
    processes = {}
    for case, (session, env, _) in cases.items():
        log = tmp_path / (f"session_{session}/logs/{len(processes)}.out" if session else f"{len(processes)}.out")
        with log.open("w") as out:
            processes[case] = subprocess.Popen(["sleep", "60"], stdout=out, env={**clean_env(tmp_path), **env})
    try:
        ended = end_dead_sessions(tmp_path)
        assert sorted(ended) == sorted(processes[c].pid for c, (_, _, gone) in cases.items() if gone)
        for case, (_, _, gone) in cases.items():
            assert (processes[case].wait(timeout=10) == -signal.SIGKILL) if gone else processes[case].poll() is None, case
        assert not (tmp_path / "session_dead" / SESSION_RECORD).exists() and (tmp_path / "session_live" / SESSION_RECORD).exists()
        assert end_dead_sessions(tmp_path) == []  # a dead session is cleaned up once
    finally:
        for process in processes.values():
            process.kill()
            process.wait()


KILLED = """
import os, sys, time, ray
from ray_access.session import init_ray

init_ray(1)

@ray.remote
class Actor:
    def pid(self):
        return os.getpid()

ray.get(Actor.remote().pid.remote())
print(ray._private.worker.global_worker.node.get_session_dir_path(), flush=True)
time.sleep(600)
"""

RESTART = """
import ray
from ray_access.session import init_ray

init_ray(1)
ray.shutdown()
"""


def processes_of(session_dir: Path) -> set[int]:
    """The live processes of the embedded session in session_dir, found as its next start finds them."""
    record = json.loads((session_dir / SESSION_RECORD).read_text())
    return set(session_processes(session_dir, record["node_id"], record["raylet_pid"]))


AGENTS = {"ray::DashboardAgent", "ray::RuntimeEnvAgent"}
"""The processes of an embedded session that outlive a SIGKILLed driver (under PID 1, deaf to SIGTERM)."""


def command_name(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().split("\0")[0]
    except OSError:  # ended meanwhile
        return None


def alive(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


@pytest.mark.slow
def test_the_next_start_ends_what_a_killed_drivers_embedded_ray_left_and_nothing_else(tmp_path, ray_session):
    """SIGKILL of a driver leaves its embedded Ray's agents running (under PID 1, deaf to SIGTERM); the next embedded
    start ends exactly these, and the processes of a live session (this test session's Ray) keep running."""
    node = ray_session._private.worker.global_worker.node
    own = processes_of(Path(node.get_session_dir_path()))
    driver = subprocess.Popen(
        [sys.executable, "-c", KILLED], cwd=ROOT, env=clean_env(tmp_path), text=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    left = set()
    try:
        session = Path(driver.stdout.readline().strip())
        assert session.is_dir(), session
        driver.kill()
        driver.wait()
        end = time.monotonic() + 120
        while True:  # the GCS, the raylet and the workers end with their driver; the two agents stay
            left = {pid: command_name(pid) for pid in processes_of(session)}
            if set(left.values()) == AGENTS or time.monotonic() > end:
                break
            time.sleep(0.2)
        assert set(left.values()) == AGENTS, left
        left = set(left)
        restart = subprocess.run(
            [sys.executable, "-c", RESTART], cwd=ROOT, env=clean_env(tmp_path), text=True, capture_output=True, timeout=120
        )
        assert restart.returncode == 0, restart.stderr[-3000:]
        ended = re.search(r"ended \d+ processes left by the embedded Ray of a killed driver: PIDs ([\d ]+)", restart.stderr)
        assert ended and set(map(int, ended.group(1).split())) == left, restart.stderr[-3000:]
        assert not (session / SESSION_RECORD).exists()
        assert [pid for pid in left if alive(pid)] == []
        assert own and own <= processes_of(Path(node.get_session_dir_path()))  # the live session untouched
    finally:
        driver.kill()
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_embedded_ray_gives_serve_proxies_time_to_become_ready(ray_session):
    """The embedded Ray's workers (where Serve's controller runs) see the proxy readiness timeout of start_local_ray, not
    Ray's 5 s: catches a default set too late (after ray.init) or in the driver only, under which Serve killed a proxy
    that a busy machine had not started within 5 s and serve.run failed."""
    from ray_access.session import PROXY_READY_TIMEOUT_S, PROXY_READY_VARIABLE

    @ray_session.remote
    def seen() -> str | None:
        return os.environ.get(PROXY_READY_VARIABLE)

    assert ray_session.get(seen.remote()) == str(PROXY_READY_TIMEOUT_S)
