"""A job's outputs land where the user said (cli/output_folders.py, docs/cluster.md).

The fast tests give a process the environment Ray's job supervisor gives a job's driver; the slow test starts
a real `ray start --head` cluster of its own (free ports, its own temp dir and HOME, token auth set explicitly),
submits the job of docs/cluster.md with `ray job submit --working-dir .` and stops only the processes of that
cluster, never `ray stop`."""

import json
import os
import re
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import ROOT, single_item

from cli.output_folders import JOB_CONFIG_ENV, resolve_out
from envs.instance import paper_instance
from plumbing.errors import InputError
from run_results.records import read_evaluation

# What Ray 2.60's job supervisor put in a driver's environment, measured with `ray job submit --working-dir .`
JOB_CONFIG = {
    "runtime_env": {"working_dir": "gcs://_ray_pkg_890f426c47b4ed0b.zip", "env_vars": {}},
    "metadata": {"job_submission_id": "raysubmit_CPUycuYd4MhqGvAF", "job_name": "raysubmit_CPUycuYd4MhqGvAF"},
}
BIN = Path(sys.executable).parent


def test_the_job_variable_is_the_one_ray_sets_for_a_drivers_job_config():
    from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR

    supervisor = Path(__import__("ray").__file__).parent / "dashboard/modules/job/job_supervisor.py"
    assert JOB_CONFIG_ENV == RAY_JOB_CONFIG_JSON_ENV_VAR
    assert "RAY_JOB_CONFIG_JSON_ENV_VAR: json.dumps(" in supervisor.read_text()


@pytest.mark.parametrize("uri", ["s3://bucket/runs/x", "gs://bucket/x", "file:///tmp/x"])
def test_uris_are_refused_everywhere(uri, monkeypatch):
    monkeypatch.delenv(JOB_CONFIG_ENV, raising=False)
    with pytest.raises(InputError, match=r"--out '.*' is a URI; the results are written through the file system"):
        resolve_out(uri)


def test_outside_a_job_a_relative_out_is_the_users_working_directory(tmp_path, monkeypatch):
    monkeypatch.delenv(JOB_CONFIG_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert resolve_out("runs/x") == Path("runs/x")
    assert resolve_out("table.md", is_file=True) == Path("table.md")
    assert list(tmp_path.iterdir()) == []  # checks create nothing


def test_a_job_refuses_a_relative_out_and_one_inside_its_working_dir_copy(tmp_path, monkeypatch):
    copy = tmp_path / "session/runtime_resources/working_dir_files/_ray_pkg_890f426c47b4ed0b"
    copy.mkdir(parents=True)
    monkeypatch.chdir(copy)
    monkeypatch.setenv(JOB_CONFIG_ENV, json.dumps(JOB_CONFIG))
    for relative in ("runs/x", ".", "../x"):
        with pytest.raises(
            InputError,
            match=rf"--out '{re.escape(relative)}' is relative, and this script runs as a Ray job: .*"
            rf"'{re.escape(str(copy))}' \(Ray's temporary copy of --working-dir, which Ray deletes\)"
            ".*give an absolute path",
        ):
            resolve_out(relative)
    with pytest.raises(InputError, match=r"--out 'table.md' is relative"):
        resolve_out("table.md", is_file=True)
    with pytest.raises(InputError, match=r"lies in Ray's temporary copy of the job's --working-dir"):
        resolve_out(str(copy / "runs/x"))
    shared = tmp_path / "shared/runs/x"
    assert resolve_out(str(shared)) == shared
    assert resolve_out(str(tmp_path / "shared/table.md"), is_file=True) == tmp_path / "shared/table.md"


def test_a_job_without_working_dir_takes_any_absolute_out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(JOB_CONFIG_ENV, json.dumps({"runtime_env": {"env_vars": {}}, "metadata": {}}))
    with pytest.raises(InputError, match=r"is relative, .*\(on the node that runs the driver\)"):
        resolve_out("runs/x")
    assert resolve_out(str(tmp_path / "runs/x")) == tmp_path / "runs/x"


@pytest.mark.slow
def test_every_script_that_writes_results_refuses_a_relative_out_under_a_job(tmp_path):
    """Run concurrently (each imports torch); RAY_ADDRESS names a dead cluster, so a script that gets past --out
    fails fast with another error instead of starting work."""
    instance = tmp_path / "inst.json"
    single_item(lead=1).save(instance)
    env = {**os.environ, JOB_CONFIG_ENV: json.dumps(JOB_CONFIG), "RAY_ADDRESS": "127.0.0.1:1"}
    cases = {
        "main.py": ["--n", "2", "--out", "runs/x"],
        "evaluate.py": ["--instance", instance, "--policy", "zero", "--episodes", "1", "--horizon", "1", "--out", "runs/x"],
        "train.py": ["--method", "hpo", "--instance", instance, "--out", "runs/x"],
        "milp.py": ["--instance", instance, "--episodes", "1", "--horizon", "1", "--out", "runs/x"],
        "bound.py": ["--instance", instance, "--episodes", "1", "--horizon", "1", "--out", "runs/x"],
        "report.py": [tmp_path / "no-results", "--out", "runs/x.md"],
        "instance.py": ["--n", "2", "--out", "runs/x.json"],
        "sweep.py": ["--config", ROOT / "tune_configs/quick.yaml", "--out", "runs/x"],
    }
    procs = {
        name: subprocess.Popen(
            [sys.executable, str(ROOT / "platform" / name), *map(str, args)],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, args in cases.items()
    }
    for name, proc in procs.items():
        _, stderr = proc.communicate(timeout=300)
        out = "runs/x.md" if name == "report.py" else "runs/x.json" if name == "instance.py" else "runs/x"
        assert proc.returncode == 2, (name, stderr[-2000:])
        assert stderr.startswith(f"error: --out '{out}' is relative, and this script runs as a Ray job"), (name, stderr[-2000:])
    assert not (tmp_path / "runs").exists()


# ---- a real cluster ---------------------------------------------------------------------------------------------

# docs/cluster.md, "A first job": run exactly as written there, with --out replaced. When platform/sweep.py is ready,
# this becomes the quick sweep (and check_results its results directory).
DOCS_JOB = "ray job submit --working-dir . -- python platform/sweep.py --config tune_configs/quick.yaml --out"


def check_results(out: Path) -> None:
    """The quick sweep's results directory: every trial finished, every baseline of both sizes whole."""
    import pyarrow.parquet as pq

    trials = pq.read_table(out / "trials.parquet").to_pylist()
    assert len(trials) == 16 and {r["status"] for r in trials} <= {"completed", "diverged"}
    names = {(r["n"], r["name"]) for r in pq.read_table(out / "baselines.parquet").to_pylist()}
    assert names == {
        (1, "classical-best"),
        (1, "dp-optimal"),
        (1, "bound"),
        (1, "milp-highs"),
        (1, "decomposition-bound"),
        (1, "decomposition-lookahead"),
        (4, "classical-best"),
        (4, "bound"),
        (4, "milp-highs"),
        (4, "decomposition-bound"),
        (4, "decomposition-lookahead"),
    }
    for n in (1, 4):
        assert (
            read_evaluation(out / "baselines" / f"n{n}" / "classical-best")["summary"]["instance_hash"]
            == paper_instance(n, 0).content_hash()
        )


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def processes_under(folder: Path) -> list[int]:
    """This user's processes whose working directory lies in `folder`: `ray start` runs there, so every process of
    its cluster does (GCS, raylet, dashboard, workers, and job drivers in their working-dir copies)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and Path(os.readlink(entry / "cwd")).is_relative_to(folder):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.fixture
def cluster():
    """A `ray start --head --block` cluster on free ports in its own temp dir, token auth on; yields the environment
    of a client (RAY_API_SERVER_ADDRESS, RAY_AUTH_MODE, the token) and its temp dir. Stops its own processes only."""
    temp = Path(tempfile.mkdtemp(prefix="rayjob", dir="/tmp"))  # short: Ray's socket paths live under it
    (temp / "home").mkdir()
    gcs, dashboard, agent_listen, agent_grpc, runtime_env, metrics, node_manager, object_manager, client = free_ports(9)
    token = secrets.token_hex(32)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("RAY_")},
        "HOME": str(temp / "home"),
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": token,
        "RAY_API_SERVER_ADDRESS": f"http://127.0.0.1:{dashboard}",
    }
    head = subprocess.Popen(
        [
            str(BIN / "ray"),
            "start",
            "--head",
            "--block",
            f"--temp-dir={temp / 'ray'}",
            "--num-cpus=2",
            "--disable-usage-stats",
            f"--port={gcs}",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dashboard}",
            f"--dashboard-agent-listen-port={agent_listen}",
            f"--dashboard-agent-grpc-port={agent_grpc}",
            f"--runtime-env-agent-port={runtime_env}",
            f"--metrics-export-port={metrics}",
            f"--node-manager-port={node_manager}",
            f"--object-manager-port={object_manager}",
            f"--ray-client-server-port={client}",
        ],
        cwd=temp,
        env=env,
        stdout=open(temp / "head.log", "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        request = urllib.request.Request(f"http://127.0.0.1:{dashboard}/api/version", headers={"Authorization": f"Bearer {token}"})
        deadline = time.monotonic() + 120
        while True:
            assert head.poll() is None, (temp / "head.log").read_text()[-3000:]
            try:
                urllib.request.urlopen(request, timeout=2).close()
                break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, "the dashboard did not answer within 120 s"
                time.sleep(0.5)
        yield env, temp
    finally:
        head.send_signal(signal.SIGTERM)  # `ray start --block` stops the processes it started
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            head.kill()
        for pid in processes_under(temp):  # and whatever outlived it (workers, a driver of a job that timed out)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        subprocess.run(["rm", "-rf", str(temp)], check=False)


@pytest.mark.slow
def test_a_submitted_job_writes_where_the_user_said(cluster, tmp_path):
    env, temp = cluster
    assert DOCS_JOB in (ROOT / "docs/cluster.md").read_text() and DOCS_JOB in (ROOT / "README.md").read_text()
    ray, *args = shlex.split(DOCS_JOB)
    out = tmp_path / "shared/quick"
    job = subprocess.run([str(BIN / ray), *args, str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    check_results(out)
    assert not list((temp / "ray").rglob("summary.json")), "results were written into Ray's session folder"

    relative = subprocess.run([str(BIN / ray), *args, "runs/job-test"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert relative.returncode != 0
    assert "error: --out 'runs/job-test' is relative, and this script runs as a Ray job" in relative.stdout + relative.stderr
    assert not (ROOT / "runs/job-test").exists()
    assert not list((temp / "ray").rglob("job-test"))
