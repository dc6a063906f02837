"""platform/cluster_demo.py without a cluster: what it refuses before a node starts (a cluster larger than the
machine, an occupied --out), and what Ctrl-C during the sweep prints. start_cluster and the sweep's process are
replaced by stand-ins, so a regression shows as a stand-in node starting, not as a machine full of raylets."""

import importlib.util
import os
import shlex
import subprocess
import sys
from types import SimpleNamespace

import pytest
from conftest import ROOT

from plumbing.errors import InputError, Interrupted
from sweeps.runner import RESUME_COMMAND

CONFIG = str(ROOT / "tune_configs" / "cluster-demo.yaml")


def load_demo():
    loaded = importlib.util.spec_from_file_location("cluster_demo", ROOT / "platform" / "cluster_demo.py")
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    return module


@pytest.fixture
def demo(monkeypatch):
    """The script as a module, with start_cluster replaced by a stand-in that records each start."""
    module = load_demo()
    module.started = []
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_ADDRESS"):  # main sets the cluster's; restored after the test
        monkeypatch.setenv(name, os.environ.get(name, ""))
        if not os.environ[name]:
            monkeypatch.delenv(name)

    def start_cluster(workers, cpus, log=print):
        module.started.append((workers, cpus))
        return FakeCluster()

    monkeypatch.setattr(module, "start_cluster", start_cluster)
    return module


class FakeCluster:
    address = "192.0.2.7:6379"

    def __init__(self):
        self.stopped = 0

    def shutdown(self):
        self.stopped += 1


class FinishedSweep:
    """The sweep's process, finished at once."""

    def __init__(self, command, env=None):
        pass

    def wait(self, timeout=None):
        return 0


def sweep_process(popen) -> SimpleNamespace:
    """The script's `subprocess` with `popen` for Popen: only the script's name is replaced, since a class defined
    while the module's Popen were replaced would keep the stand-in (Ray's ConsolePopen subclasses it on import)."""
    return SimpleNamespace(Popen=popen, TimeoutExpired=subprocess.TimeoutExpired)


def run_main(demo, monkeypatch, *args):
    monkeypatch.setattr(sys, "argv", ["cluster_demo.py", *map(str, args)])
    demo.main()


def test_the_machines_room_is_counted_as_worked_out_by_hand():
    """Catches a wrong sum in the capacity rule: 2 nodes of 2 CPUs need 140 + 2 x (140 + 2 x 410) = 2,060 MiB
    (the head without CPUs, then each worker node and its worker processes) and 4 CPUs, at most 2 x 2 cores."""
    module = load_demo()
    assert module.capacity_problem(2, 2, cores=2, available_mib=2060) is None
    assert "about 2,060 MiB of memory" in module.capacity_problem(2, 2, cores=2, available_mib=2059)
    assert "5 CPUs in all, and this machine has 2 cores: expected --workers x --cpus <= 2 x 2 = 4" in module.capacity_problem(
        5, 1, cores=2, available_mib=10**6
    )


def test_the_clusters_authentication_is_set_before_the_sweep_file_is_read(demo, monkeypatch, tmp_path):
    """Catches main reading the sweep file (whose checks import Ray, which reads RAY_AUTH_MODE once) before it sets
    the cluster's token authentication: the script's own Ray client then ran without it and the cluster refused it
    ('Authentication token is missing or incorrect')."""
    modes = []
    read_spec = demo.read_spec
    monkeypatch.setattr(demo, "read_spec", lambda path: modes.append(os.environ.get("RAY_AUTH_MODE")) or read_spec(path))
    monkeypatch.setattr(demo, "subprocess", sweep_process(FinishedSweep))
    run_main(demo, monkeypatch, "--workers", 1, "--cpus", 1, "--config", CONFIG, "--out", tmp_path / "out")
    assert modes == ["token"] and demo.started == [(1, 1)]


def test_a_cluster_larger_than_the_machine_is_refused_before_any_node_starts(demo, monkeypatch, tmp_path):
    """Catches `--workers 500 --cpus 1` being accepted (it started 161 raylets and exhausted the machine): refused
    in one line naming the flags, and no node started."""
    with pytest.raises(InputError, match="--workers 500 --cpus 1: ") as refused:
        run_main(demo, monkeypatch, "--workers", 500, "--cpus", 1, "--out", tmp_path / "out")
    assert demo.started == [] and ("cores" in str(refused.value) or "MiB" in str(refused.value))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("resume", [False, True])
def test_an_occupied_out_is_refused_before_any_node_starts(demo, monkeypatch, tmp_path, resume):
    """Catches --out being checked only by the sweep on the cluster, after starting and stopping it (35 s): a
    folder that holds something else, or no sweep to resume, is refused with no node started."""
    out = tmp_path / "busy"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    expected = "holds no sweep to resume" if resume else "is not empty and holds no sweep"
    with pytest.raises(InputError, match=expected):
        run_main(demo, monkeypatch, "--workers", 1, "--cpus", 1, "--config", CONFIG, "--out", out, *(["--resume"] if resume else []))
    assert demo.started == [] and [p.name for p in out.iterdir()] == ["notes.txt"]


def test_ctrl_c_stops_the_cluster_then_names_only_the_command_that_starts_a_new_one(demo, monkeypatch, tmp_path, capsys):
    """Catches the sweep's Ctrl-C message naming `platform/sweep.py --address <this cluster>`, a cluster that the
    demo stops on the next line: the sweep gets the demo's own resume command, and the demo's last words come after
    it stopped the cluster."""
    out = tmp_path / "out"
    launched = []

    class Sweep:
        def __init__(self, command, env=None):
            launched.append((command, env))

        def wait(self, timeout=None):
            if timeout is None:  # the sweep began (its sweep.json is written), then Ctrl-C
                out.mkdir()
                (out / "sweep.json").write_text("{}")
                raise KeyboardInterrupt
            return 130

    monkeypatch.setattr(demo, "subprocess", sweep_process(Sweep))
    clusters = []
    monkeypatch.setattr(demo, "start_cluster", lambda workers, cpus, log=print: clusters.append(FakeCluster()) or clusters[-1])
    with pytest.raises(Interrupted) as stopped:
        run_main(demo, monkeypatch, "--workers", 1, "--cpus", 1, "--config", CONFIG, "--out", out)
    resume = shlex.join(
        ["python", "platform/cluster_demo.py", "--workers", "1", "--cpus", "1", "--config", CONFIG, "--out", str(out), "--resume"]
    )
    ((command, env),) = launched
    assert env is not None and env[RESUME_COMMAND] == resume and FakeCluster.address not in env[RESUME_COMMAND]
    assert str(stopped.value).startswith("stopped the cluster;") and str(stopped.value).endswith(f"continue with: {resume}")
    assert clusters[0].stopped == 1 and capsys.readouterr().out.splitlines()[-1] == "stopping the cluster"
