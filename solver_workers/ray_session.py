"""The platform's one way to reach Ray: a cluster (RAY_ADDRESS, as under `ray job submit`, or --address)
or an embedded local Ray started for this process, reachable from this machine only (docs/ray.md)."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import threading
from contextlib import contextmanager
from typing import Optional

import ray
from ray._private import ray_constants, services

from envs.errors import InputError

PROBE_SECONDS = 3.0  # a live cluster accepts a TCP connection well within this; Ray itself retries for minutes


@contextmanager
def keep_sigterm_handler():
    """ray.init installs its own SIGTERM handler, which ends the process without the script's chance to save
    its work (envs.cli.run_cli turns SIGTERM into KeyboardInterrupt): put the script's handler back."""
    main_thread = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGTERM) if main_thread else None
    try:
        yield
    finally:
        if main_thread and handler is not None:
            signal.signal(signal.SIGTERM, handler)


def start_local_ray(num_cpus: int, **options) -> None:
    """Start an embedded Ray for this process: every port on loopback, token auth without ~/.ray/auth_token.

    Ray 2.60 binds its gRPC servers (GCS, raylet, object manager, workers) to loopback only when the node IP is
    loopback, and ray.init turns a loopback node IP into the machine's address unless Ray's cluster mode is off
    (ray_constants.ENABLE_RAY_CLUSTER, otherwise only read from RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER when ray is
    imported); Ray passes the node IP to every process it starts. Ray writes a new token to ~/.ray/auth_token
    unless one is configured, so give it a token for this process in RAY_AUTH_TOKEN, which its processes inherit.
    """
    if not (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")):
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    cluster_mode, ray_constants.ENABLE_RAY_CLUSTER = ray_constants.ENABLE_RAY_CLUSTER, False
    try:
        with keep_sigterm_handler():
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, **options)
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = cluster_mode


def init_ray(workers: int, address: Optional[str] = None) -> None:
    """Connect to a cluster (--address, else RAY_ADDRESS as under `ray job submit`) or start an embedded Ray."""
    if ray.is_initialized():
        return
    where = f"--address {address}" if address else f"RAY_ADDRESS={os.environ.get('RAY_ADDRESS')}"
    address = address or os.environ.get("RAY_ADDRESS")
    if not address or address == "local":
        start_local_ray(max(workers, os.cpu_count() or 1))
        return
    if "://" in address:
        raise InputError(f"{where}: Ray Client and URL addresses are not supported; give the cluster's GCS address "
                         "HOST:PORT (e.g. 10.0.0.5:6379) or auto, or run the script with `ray job submit`")
    probe_address(address, where)
    try:
        with keep_sigterm_handler():
            ray.init(address=address)
    except ConnectionError as e:  # a cluster that went away after the probe, or a port where something else answers
        raise InputError(f"{where}: no Ray cluster answers there ({e})") from e


def stop_ray() -> None:
    """Disconnect from Ray, stopping an embedded Ray, before the script's last line. Left to Ray's exit hook, the driver
    first waits half a second relaying its workers' output: the log lines Ray holds back to deduplicate, and the
    traceback of a worker that the raylet stopped with SIGTERM while it ran Python code (Ray's worker handler,
    `sigterm_handler`, raises SystemExit there); they were printed after the script's last line."""
    if ray.is_initialized():
        ray.shutdown()


def probe_address(address: str, where: str) -> None:
    """Refuse a malformed address, or one where nothing accepts a TCP connection within PROBE_SECONDS.

    Probes the GCS address that ray.init will dial: Ray's own resolution, which finds the cluster for `auto`
    and replaces a loopback host by this machine's address. The error names the address as given (and, for
    `auto`, the one it found), never Ray's replacement of a loopback host.
    """
    malformed = f"{where}: expected HOST:PORT (the cluster's GCS address, e.g. 10.0.0.5:6379) or auto"
    try:
        target = services.canonicalize_bootstrap_address(address)
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
