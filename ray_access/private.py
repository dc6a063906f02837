"""Every use of Ray's private APIs (ray._private, and private hooks of Tune and RLlib), in one place: the platform
needs each one for something Ray's public API does not offer, and tests/test_ray_private.py checks each
assumption on the installed Ray, so that a Ray upgrade that breaks one fails there, under its name.

Written against Ray 2.60. The modules of ray.tune and ray.rllib are imported by the functions that need them
(they take seconds, and most scripts never use them).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import ray
from ray._private import ray_constants, services
from ray._private import state as _state
from ray._private import worker as _worker
from ray._private.authentication import authentication_token_setup as _auth_setup
from ray._private.ray_logging import global_worker_stdstream_dispatcher

GCS_PORT_VARIABLE = ray_constants.GCS_PORT_ENVIRONMENT_VARIABLE
"""The environment variable that gives a head node started by ray.init its GCS port (RAY_GCS_SERVER_PORT)."""


@contextmanager
def cluster_mode_off() -> Iterator[None]:
    """Inside: ray.init keeps a loopback node IP, so an embedded Ray binds its servers to loopback only. Ray reads
    ray_constants.ENABLE_RAY_CLUSTER (from RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER, once, at import) to decide whether a
    loopback node IP is replaced by the machine's address."""
    cluster_mode, ray_constants.ENABLE_RAY_CLUSTER = ray_constants.ENABLE_RAY_CLUSTER, False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = cluster_mode


class LocalNode(NamedTuple):
    """The node that this driver's ray.init started (an embedded Ray)."""

    session_dir: str
    temp_dir: str
    node_id: str
    raylet_pid: int


def _local_node(node) -> LocalNode:
    raylet = node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process
    return LocalNode(node.get_session_dir_path(), node.get_temp_dir_path(), node.node_id, raylet.pid)


def local_node() -> LocalNode:
    """The node of this process's embedded Ray (after ray.init(address="local")): ray._private.worker.global_worker.node,
    its session and temp folders, id, and the raylet's process (Node.all_processes)."""
    return _local_node(_worker.global_worker.node)


def starting_node() -> LocalNode | None:
    """The local node that this process's ray.init is starting or started (ray._private.worker._global_node, set before
    ray.init connects), or None while there is no node or no raylet yet (nothing that starts agents)."""
    try:
        return _local_node(_worker._global_node)
    except (AttributeError, KeyError, IndexError):
        return None


def token_notice_logger() -> logging.Logger:
    """The logger of Ray's notice that ray.init chose token authentication (ray._private.authentication.
    authentication_token_setup)."""
    return logging.getLogger(_auth_setup.__name__)


def gcs_address(address: str) -> str:
    """The GCS address (host:port) that ray.init dials for `address` (host:port or auto): Ray's own resolution
    (services.canonicalize_bootstrap_address), which finds the cluster for auto and replaces a loopback host by this
    machine's address. Raises ConnectionError for auto with no Ray on this machine, ValueError for a malformed one."""
    return services.canonicalize_bootstrap_address(address)


def gcs_silence(address: str, seconds: float) -> str | None:
    """Why no Ray GCS answers a gRPC call at `address` (HOST:PORT) within `seconds` (the status, e.g. a TCP port where
    another server answers), or None when one does: its GetClusterId reply, or a refusal only a GCS gives
    (authentication). With TLS (RAY_USE_TLS) nothing is asked here: ray.init's own handshake decides."""
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return None
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        try:
            stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
            stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), timeout=seconds)
        except grpc.RpcError as error:
            if error.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                return None
            return f"{error.code().name.lower()}: {(error.details() or '').strip() or 'no reply'}"
    return None


def node_ip_address() -> str:
    """This machine's address as Ray's nodes advertise it (services.get_node_ip_address)."""
    return services.get_node_ip_address()


def actor_table(job_id: str | None = None, actor_id: str | None = None) -> Any:
    """Ray's actor table (ray._private.state.actors), dead actors included with their node: every actor of the job
    `job_id` (hex, as ray.get_runtime_context().get_job_id() gives it) by actor id, or the one actor `actor_id` (keys
    ActorClassName, Address with NodeID, OwnerAddress)."""
    if actor_id is not None:
        return _state.actors(actor_id=actor_id)
    return _state.actors(job_id=None if job_id is None else ray.JobID.from_hex(job_id))


def route_worker_output(write: Callable[..., None]) -> Callable[[], None]:
    """Sends the workers' stdout and stderr that the driver relays (log_to_driver), and the raylet's messages to the job, to `write(batch)`
    instead of the console: replaces Ray's handler "ray_print_logs" and ray._private.worker.print_to_stdstream, which Ray calls as
    print_to_stdstream(batch, ignore_prefix) (docs/ray.md, "The console"). Returns the function that puts Ray's printers back."""
    printers = [(name, h) for name, h in global_worker_stdstream_dispatcher.handlers if name == "ray_print_logs"]
    global_worker_stdstream_dispatcher.remove_handler("ray_print_logs")
    global_worker_stdstream_dispatcher.add_handler("ray_print_logs", write)
    raylet_printer, _worker.print_to_stdstream = _worker.print_to_stdstream, write

    def restore() -> None:
        if any(handler == write for _, handler in global_worker_stdstream_dispatcher.handlers):
            global_worker_stdstream_dispatcher.remove_handler("ray_print_logs")  # Ray's disconnect removes it too
            for name, handler in printers:
                global_worker_stdstream_dispatcher.add_handler(name, handler)
        if _worker.print_to_stdstream == write:
            _worker.print_to_stdstream = raylet_printer

    return restore


def filter_autoscaler_events(lines: list[str]) -> list[str]:
    """The lines of the autoscaler's output batch that Ray itself would print (its periodic status report left out)."""
    return list(_worker.filter_autoscaler_events(lines))


def in_tune_session() -> bool:
    """Whether this code runs inside a Tune trial (a function trainable's process), where Ray Train's results must be
    forwarded to Tune (ray.tune.trainable.trainable_fn_utils._in_tune_session)."""
    from ray.tune.trainable.trainable_fn_utils import _in_tune_session

    return bool(_in_tune_session())  # None outside any session


def logging_to(algorithm_class: type, logdir: str) -> type:
    """A subclass of the RLlib algorithm `algorithm_class` whose logs (result.json, progress.csv, TensorBoard) go to
    `logdir` instead of Tune's default ~/ray_results: Trainable.__init__ calls the private hook _setup_logdir, which
    must set self._logdir."""

    class LoggingTo(algorithm_class):
        def _setup_logdir(self):
            self._logdir = logdir
            os.makedirs(logdir, exist_ok=True)

    return LoggingTo
