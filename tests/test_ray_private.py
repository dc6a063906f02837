"""One test per assumption that ray_access/private.py makes about Ray's private APIs: after a Ray upgrade, a
failure here names the assumption that no longer holds (the code that relies on it is in that module alone)."""

import inspect
import ipaddress
import os
import re
from pathlib import Path

import pytest
from ray._private import ray_constants

from plumbing.errors import InputError
from ray_access import private as ray_private
from ray_access.session import probe_address


def test_cluster_mode_is_a_module_flag_that_cluster_mode_off_clears_and_restores():
    """ray_constants.ENABLE_RAY_CLUSTER is the flag ray.init reads to replace a loopback node IP (catches its rename or
    removal, which would make an embedded Ray listen on the machine's address)."""
    before = ray_constants.ENABLE_RAY_CLUSTER
    assert isinstance(before, bool)
    with ray_private.cluster_mode_off():
        assert ray_constants.ENABLE_RAY_CLUSTER is False
    assert ray_constants.ENABLE_RAY_CLUSTER is before
    assert "ray_constants.ENABLE_RAY_CLUSTER" in inspect.getsource(ray_private.services.get_node_ip_address)


def test_the_local_node_has_its_folders_id_and_a_live_raylet(ray_session):
    """global_worker.node of an embedded Ray gives its session and temp folders, its id and the raylet's process."""
    node = ray_private.local_node()
    assert Path(node.session_dir).is_dir() and Path(node.session_dir).parent == Path(node.temp_dir)
    assert node.node_id == ray_session.get_runtime_context().get_node_id()
    os.kill(node.raylet_pid, 0)  # raises if no such process
    assert "raylet" in Path(f"/proc/{node.raylet_pid}/cmdline").read_bytes().decode(errors="replace")


def test_gcs_address_keeps_a_host_port_and_refuses_a_malformed_one():
    """services.canonicalize_bootstrap_address returns host:port for host:port and raises ValueError for text that is
    not one (ray_session.probe_address turns that into its error line)."""
    assert ray_private.gcs_address("192.0.2.7:6379") == "192.0.2.7:6379"
    with pytest.raises(ValueError):
        ray_private.gcs_address("not an address:port:x")


def test_node_ip_address_is_an_ip_address():
    ipaddress.ip_address(ray_private.node_ip_address())


def test_the_actor_table_holds_an_actor_with_its_class_address_node_and_owner(ray_session):
    """state.actors by job and by actor id, with the keys sweeps.runner.train_nodes reads (ActorClassName, Address.NodeID,
    OwnerAddress)."""

    @ray_session.remote(num_cpus=0)
    class Probe:
        def actor_id(self):
            return ray_session.get_runtime_context().get_actor_id()

    probe = Probe.remote()
    try:
        actor_id = ray_session.get(probe.actor_id.remote(), timeout=60)
        by_job = ray_private.actor_table(job_id=ray_session.get_runtime_context().get_job_id())
        one = ray_private.actor_table(actor_id=actor_id)
        assert (
            one["ActorClassName"].rpartition(".")[2] == "Probe"
            and one["Address"]["NodeID"] == ray_session.get_runtime_context().get_node_id()
        )
        assert "OwnerAddress" in one and any(a["ActorClassName"] == one["ActorClassName"] for a in by_job.values())
    finally:
        ray_session.kill(probe)


def test_worker_output_goes_through_the_named_handler_of_the_dispatcher():
    """ray.init(log_to_driver=True) registers the printer of the workers' output as the dispatcher's handler
    "ray_print_logs", and the dispatcher sends each batch to its handlers by name: route_worker_output replaces it
    (catches a rename, after which the workers' output would reach the console beside the log file)."""
    from ray._private import worker

    assert '"ray_print_logs"' in inspect.getsource(worker.connect)
    dispatcher = ray_private.global_worker_stdstream_dispatcher
    before, printer = list(dispatcher.handlers), worker.print_to_stdstream
    got = []
    try:
        restore = ray_private.route_worker_output(lambda batch, *ignore: got.append(batch))
        dispatcher.emit({"lines": ["x"], "pid": 1})
        assert got == [{"lines": ["x"], "pid": 1}] and [name for name, _ in dispatcher.handlers].count("ray_print_logs") == 1
        restore()
        assert dispatcher.handlers == before and worker.print_to_stdstream is printer
    finally:
        dispatcher.handlers, worker.print_to_stdstream = before, printer


def test_the_raylets_messages_are_printed_by_the_module_function_print_to_stdstream():
    """The driver's thread listen_error_messages prints the raylet's messages (its worker pool's size warning) by calling
    the module-level print_to_stdstream(batch, ignore_prefix), which route_worker_output replaces (catches a change after
    which those messages would reach the console beside the log file)."""
    from ray._private import worker

    assert "print_to_stdstream(" in inspect.getsource(worker.listen_error_messages)
    assert list(inspect.signature(worker.print_to_stdstream).parameters)[:2] == ["data", "ignore_prefix"]


def test_the_node_being_started_is_the_module_global_node(ray_session):
    """ray.init sets ray._private.worker._global_node before it connects; starting_node reads it (catches a rename, after
    which a Ctrl-C during ray.init would leave the raylet's agents running)."""
    from ray._private import worker

    assert "_global_node = " in inspect.getsource(worker.init)
    assert ray_private.starting_node() == ray_private.local_node()


def test_the_token_notice_comes_from_the_authentication_setup_logger():
    """Ray logs its 'Token authentication is enabled' notice through the logger of the module
    ray._private.authentication.authentication_token_setup, which ray_session filters (catches a move of the notice,
    after which it would be printed on every start of an embedded Ray)."""
    from ray._private.authentication import authentication_token_setup

    assert "Token authentication is enabled" in inspect.getsource(authentication_token_setup)
    assert ray_private.token_notice_logger().name == authentication_token_setup.__name__


def test_the_autoscaler_filter_drops_the_status_report(ray_session):
    """filter_autoscaler_events takes the autoscaler's lines and keeps only its events (it needs a connected driver: it
    asks the GCS which autoscaler runs): catches a change after which the sweep's log would fill with status reports."""
    kept = ray_private.filter_autoscaler_events(["======== Autoscaler status: 2026-01-28 ========", "Node status"])
    assert isinstance(kept, list) and all(isinstance(line, str) for line in kept) and "Node status" not in kept


def test_outside_tune_there_is_no_tune_session():
    assert ray_private.in_tune_session() is False


def test_a_trainable_makes_its_log_folder_through_the_setup_logdir_hook(tmp_path):
    """Trainable.__init__ calls _setup_logdir and then uses self._logdir (catches a rename of the hook, after which
    RLlib would log to ~/ray_results again): a bare Trainable subclassed by logging_to logs where it is told."""
    from ray.tune import Trainable

    class Bare(Trainable):
        def setup(self, config):
            pass

    trainable = ray_private.logging_to(Bare, str(tmp_path / "logs"))()
    try:
        assert trainable.logdir.rstrip("/") == str(tmp_path / "logs") and (tmp_path / "logs").is_dir()
    finally:
        trainable.stop()


def test_the_gcs_port_of_a_head_started_by_ray_init_comes_from_its_environment_variable():
    """ray.init's head node reads its GCS port from GCS_PORT_VARIABLE (catches a rename, after which ray_session's
    RAY_ADDRESS would name a port where the embedded Ray's GCS does not listen)."""
    from ray._private import node

    assert ray_private.GCS_PORT_VARIABLE == "RAY_GCS_SERVER_PORT"
    assert "GCS_PORT_ENVIRONMENT_VARIABLE" in inspect.getsource(node)


def test_a_gcs_answers_the_cluster_id_call_and_another_server_does_not(ray_session):
    """gcs_silence: None at the session's GCS (NodeInfoGcsService.GetClusterId answers, or refuses authentication);
    at a port where a plain TCP server accepts and closes, the gRPC status, within the time it is given."""
    import socket
    import threading
    import time

    assert ray_private.gcs_silence(ray_session.get_runtime_context().gcs_address, 3.0) is None
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()

        def hang_up():
            for _ in range(8):
                try:
                    server.accept()[0].close()
                except OSError:
                    return

        threading.Thread(target=hang_up, daemon=True).start()
        started = time.monotonic()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        silence = ray_private.gcs_silence(address, 2.0)
        assert silence is not None and silence.split(":")[0] in ("unavailable", "deadline_exceeded", "unimplemented", "internal")
        assert time.monotonic() - started < 10
        with pytest.raises(InputError, match=re.escape(f"--address {address}: no Ray cluster answers there (not a Ray GCS: ")):
            probe_address(address, f"--address {address}")  # before ray.init, which would retry for 20 s
