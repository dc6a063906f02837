"""The platform's one way to reach Ray: a cluster (RAY_ADDRESS, as under `ray job submit`, or --address)
or an embedded local Ray started for this process, reachable from this machine only (docs/ray.md)."""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import socket
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ray

from plumbing.errors import InputError
from ray_access.private import GCS_PORT_VARIABLE, cluster_mode_off, gcs_address, gcs_silence, local_node, starting_node, token_notice_logger

PROBE_SECONDS = 3.0  # a live cluster accepts a TCP connection well within this; Ray itself retries for minutes


@contextmanager
def keep_sigterm_handler():
    """ray.init installs its own SIGTERM handler, which ends the process without the script's chance to save
    its work (cli.scripts.run_cli turns SIGTERM into KeyboardInterrupt): put the script's handler back."""
    main_thread = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGTERM) if main_thread else None
    try:
        yield
    finally:
        if main_thread and handler is not None:
            signal.signal(signal.SIGTERM, handler)


TOKEN_NOTICE = "Token authentication is enabled for this Ray cluster"
"""How ray.init begins the warning it logs on every start of a local Ray without RAY_AUTH_MODE ("... Set
RAY_AUTH_MODE=disabled to opt out", from the logger ray_access.private.token_notice_logger)."""


def free_port() -> int:
    """A TCP port free on loopback now, for a server that a script starts next and must know the port of in
    advance (a Ray head's GCS, whose address the processes it starts inherit)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def without_token_notice(record: logging.LogRecord) -> bool:
    """A filter of Ray's authentication logger: the embedded Ray has token authentication by this module's choice, so
    Ray's notice that it chose it is dropped; every other record of that logger passes."""
    return not record.getMessage().startswith(TOKEN_NOTICE)


@contextmanager
def session_address():
    """While an embedded Ray starts: RAY_GCS_SERVER_PORT set to a free port and RAY_ADDRESS to that GCS, inherited by the session's
    processes, so that a Ray client inside it given no address finds this session, not the machine's latest Ray (docs/ray.md, "The
    embedded Ray listens on 127.0.0.1 only"). This process's environment is restored after: its later subprocesses must not take a
    session that ends with it for a cluster."""
    port = free_port()
    session = {"RAY_ADDRESS": f"127.0.0.1:{port}", GCS_PORT_VARIABLE: str(port)}
    before = {name: os.environ.get(name) for name in session}
    os.environ.update(session)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


PROXY_READY_VARIABLE = "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"
PROXY_READY_TIMEOUT_S = 60
"""Seconds an embedded Ray's Serve controller waits for an HTTP proxy to be ready (start_local_ray)."""


def start_local_ray(num_cpus: int, dashboard: bool = False, **options) -> str | None:
    """Start an embedded Ray for this process: every port on loopback, token auth without ~/.ray/auth_token; with
    `dashboard`, Ray's dashboard too (on 127.0.0.1), whose URL is returned. Ends what an embedded Ray of a killed
    driver left behind (end_dead_sessions)."""
    # Ray writes a new ~/.ray/auth_token unless a token is configured: one for this process, inherited by Ray's processes
    if not (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")):
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    # Serve restarts a proxy that is not ready within Ray's 5 s, which a busy machine can exceed (serve.run then fails)
    os.environ.setdefault(PROXY_READY_VARIABLE, str(PROXY_READY_TIMEOUT_S))
    token_notice_logger().addFilter(without_token_notice)  # a filter already there is not added twice
    try:
        # gRPC servers bind to loopback only for a loopback node IP, which ray.init keeps with cluster mode off
        with cluster_mode_off(), keep_sigterm_handler(), session_address():
            context = ray.init(address="local", num_cpus=num_cpus, include_dashboard=dashboard, dashboard_host="127.0.0.1", **options)
        node = local_node()
        EMBEDDED[os.getpid()] = (Path(node.session_dir), node.node_id, node.raylet_pid)  # from here stop_ray ends it all
    except BaseException:  # Ctrl-C (or a failure) while Ray starts: end what it started so far, its agents included
        end_session(starting_session())
        raise
    if ended := end_dead_sessions(Path(node.temp_dir)):
        print(
            f"ended {len(ended)} processes left by the embedded Ray of a killed driver: PIDs {' '.join(map(str, ended))}", file=sys.stderr
        )
    record_session(*EMBEDDED[os.getpid()])
    return f"http://{context.dashboard_url}" if dashboard and context.dashboard_url else None


# ---- what an embedded Ray of a killed driver leaves behind ----------------------------------------------------------
# The driver starts the embedded Ray's GCS and raylet; both end when the driver dies, even by SIGKILL, but the raylet's
# agents (ray::DashboardAgent, ray::RuntimeEnvAgent) outlive them under PID 1, for a minute or more, and ignore
# SIGTERM (docs/ray.md). Each embedded session leaves a record in its session folder, so that the next embedded start
# can tell a dead session's processes from those of live sessions (other scripts', other tests', `ray start`
# clusters') and end exactly these.

SESSION_RECORD = "embedded-driver.json"
EMBEDDED: dict[int, tuple[Path, str, int]] = {}
"""The embedded session this driver started and has not stopped, by the driver's PID (a forked child is not its driver):
(session folder, node id, raylet PID), for stop_ray."""


def starting_session() -> tuple[Path, str, int] | None:
    """(session folder, node id, raylet PID) of the local Ray node this process starts or started, or None while it
    has not got that far (no node, or no raylet yet: nothing that starts agents)."""
    node = starting_node()
    return None if node is None else (Path(node.session_dir), node.node_id, node.raylet_pid)


RAY_DAEMONS = ("raylet", "gcs_server")
"""The processes that ray.init starts as this driver's children; the raylet starts the agents as its own."""


def started_by_this_driver() -> list[int]:
    """The Ray processes this driver started (RAY_DAEMONS among its children) and all their descendants."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit():
                stat = (entry / "stat").read_text()
                names[int(entry.name)] = stat[stat.index("(") + 1 : stat.rindex(")")]
                parents[int(entry.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError):  # gone
            continue
    found = [pid for pid, parent in parents.items() if parent == os.getpid() and names[pid] in RAY_DAEMONS]
    for pid in found:  # grows while it is walked: each one's children join it
        found += [child for child, parent in parents.items() if parent == pid]
    return found


def end_session(session: tuple[Path, str, int] | None) -> None:
    """Stop Ray and SIGKILL what is left of this driver's embedded `session`: the raylet's agents outlive a Ray stopped
    during its start-up (Ctrl-C in ray.init or serve.start) by a minute or more, under PID 1. Cut short before Ray
    knew its node (ray.init waiting for the raylet to register), a start has no session yet: what this driver started
    is then its raylet and GCS, and what they started."""
    started = started_by_this_driver() if session is None else []  # before ray.shutdown: the agents are the raylet's children
    ray.shutdown()
    for pid in started if session is None else session_processes(*session, holding_files=False):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if session is not None:
        (session[0] / SESSION_RECORD).unlink(missing_ok=True)


def process_start(pid: int) -> int | None:
    """The start time of process `pid` (clock ticks after boot, /proc/PID/stat), or None when there is none: a
    PID with another start time is another process."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def record_session(session_dir: Path, node_id: str, raylet_pid: int) -> None:
    """Write SESSION_RECORD: this driver (pid and start time), and the node and raylet whose processes it starts."""
    record = {"driver_pid": os.getpid(), "driver_start": process_start(os.getpid()), "node_id": node_id, "raylet_pid": raylet_pid}
    (session_dir / SESSION_RECORD).write_text(json.dumps(record))


def session_processes(session_dir: Path, node_id: str, raylet_pid: int, holding_files: bool = True) -> list[int]:
    """This user's processes, other than this one, of the session in `session_dir`: those naming its node (RAY_NODE_ID: the agents) or
    raylet (RAY_RAYLET_PID: the workers) in their environment and, with `holding_files`, holding a file open in the session folder, which
    tells them from a later session's whose raylet got the same PID. A session this process stops itself needs no such check (False):
    its agents, started just before a stop during start-up, may not have opened a file yet."""
    marks = (f"RAY_NODE_ID={node_id}".encode(), f"RAY_RAYLET_PID={raylet_pid}".encode())
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or int(entry.name) == os.getpid() or entry.stat().st_uid != os.getuid():
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
            opened = [os.readlink(fd) for fd in (entry / "fd").iterdir()]
        except OSError:  # gone, or another user's
            continue
        if any(mark in environ for mark in marks) and (not holding_files or any(Path(path).is_relative_to(session_dir) for path in opened)):
            found.append(int(entry.name))
    return found


def end_dead_sessions(temp_dir: Path) -> list[int]:
    """SIGKILL the processes of every embedded session under `temp_dir` whose driver is gone; returns their PIDs.
    A session whose driver still runs is left alone, and so is any session without a record (not embedded)."""
    ended = []
    sessions = (session for session in temp_dir.glob("session_*") if not session.is_symlink())  # not session_latest
    for path in sorted(session / SESSION_RECORD for session in sessions if (session / SESSION_RECORD).is_file()):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if process_start(record["driver_pid"]) == record["driver_start"]:
            continue  # a live session
        for pid in session_processes(path.parent, record["node_id"], record["raylet_pid"]):
            try:
                os.kill(pid, signal.SIGKILL)
                ended.append(pid)
            except ProcessLookupError:
                pass
        path.unlink(missing_ok=True)
    return ended


def init_ray(workers: int, address: str | None = None, dashboard: bool = False) -> str | None:
    """Connect to a cluster (--address, else RAY_ADDRESS as under `ray job submit`) or start an embedded Ray (with
    its dashboard when asked; returns the dashboard's URL then)."""
    if ray.is_initialized():
        return None
    where = f"--address {address}" if address else f"RAY_ADDRESS={os.environ.get('RAY_ADDRESS')}"
    address = address or os.environ.get("RAY_ADDRESS")
    if not address or address == "local":
        return start_local_ray(max(workers, os.cpu_count() or 1), dashboard)
    if "://" in address:
        raise InputError(
            f"{where}: Ray Client and URL addresses are not supported; give the cluster's GCS address "
            "HOST:PORT (e.g. 10.0.0.5:6379) or auto, or run the script with `ray job submit`"
        )
    probe_address(address, where)
    try:
        with keep_sigterm_handler():
            ray.init(address=address)
    except ConnectionError as e:  # a cluster that went away after the probe, or a port where something else answers
        raise InputError(f"{where}: no Ray cluster answers there ({e})") from e
    return None


def this_node() -> dict[str, Any]:
    """Where this Ray process runs, for the results' records of trial attempts and solver tasks: node id, IP, name
    (`ray start --node-name`; Ray's default is the IP) and process id."""
    node_id = ray.get_runtime_context().get_node_id()
    name = next((node["NodeName"] for node in ray.nodes() if node["NodeID"] == node_id), None)
    return {"node_id": node_id, "node_ip": ray.util.get_node_ip_address(), "node_name": name, "pid": os.getpid()}


def stop_ray() -> None:
    """Disconnects from Ray, ending an embedded Ray's processes (end_session); call it before the script's last line. Left to Ray's exit
    hook, the workers' held-back log lines and the SystemExit traceback of a worker the raylet stopped with SIGTERM print after it."""
    if os.getpid() in EMBEDDED:
        end_session(EMBEDDED.pop(os.getpid()))
    elif ray.is_initialized():
        ray.shutdown()


def probe_address(address: str, where: str) -> None:
    """Raises InputError for a malformed address, one where nothing accepts a TCP connection within PROBE_SECONDS, or one where something
    other than a Ray GCS answers (ray.init would retry it for 20 s). Probes the address ray.init will dial (Ray's resolution of `auto`
    and of a loopback host); the error names the address as given (and, for `auto`, the one found), never Ray's loopback replacement."""
    malformed = f"{where}: expected HOST:PORT (the cluster's GCS address, e.g. 10.0.0.5:6379) or auto"
    try:
        target = gcs_address(address)
    except ConnectionError as e:  # `auto` and no Ray on this machine
        raise InputError(f"{where}: no Ray cluster answers there ({e})") from e
    except ValueError as e:
        raise InputError(malformed) from e
    host, _, port = target.rpartition(":")
    if not (port.isdigit() and 0 < int(port) < 65536):
        raise InputError(malformed)
    found = f"auto found {target}: " if address == "auto" else ""
    try:
        socket.create_connection((host.removeprefix("[").removesuffix("]"), int(port)), timeout=PROBE_SECONDS).close()
    except TimeoutError as e:
        raise InputError(f"{where}: no Ray cluster answers there ({found}no answer within {PROBE_SECONDS:g} s)") from e
    except OSError as e:
        raise InputError(f"{where}: no Ray cluster answers there ({found}{e.strerror or e})") from e
    if (silence := gcs_silence(target, PROBE_SECONDS)) is not None:  # a port where another server answers
        raise InputError(f"{where}: no Ray cluster answers there ({found}not a Ray GCS: {silence})")
