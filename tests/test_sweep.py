"""platform/sweep.py end to end on the embedded Ray: the results directory's schema, resumption after the
driver is killed (nothing lost, nothing duplicated, nothing finished run again) and a trial whose process
is killed mid-training (retried from its checkpoint, every update of its curve exactly once)."""

import json
import os
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest
import yaml
from conftest import ROOT
from helpers import Gate

from run_results.records import read_evaluation

UPDATES = 30
SWEEP = {
    "sizes": [1],
    "seeds": 1,
    "methods": ["hpo", "ppo"],
    "overrides": {
        "all": {"batch": 8, "updates": UPDATES, "blocks": 1, "width": 16, "heads": 2, "feed_forward": 32, "hidden": 32},
        "hpo": {"checkpoint_every": 5, "imitation_updates": 0},
    },
    "resources": {"all": {"workers": 0, "cpus_per_worker": 1}},
    "evaluation": {"episodes": 8, "horizon": 10},
    "baselines": {
        "classical_best": True,
        "dp_optimal": True,
        "bound": {"time_limit": 10},
        "milp": [{"scenarios": 3, "plan_horizon": 5, "time_limit": 2, "episodes": 2, "horizon": 3}],
    },
    "concurrency": 1,
    "retries": 2,
}


def start(tmp_path, sweep: dict, *flags, env: dict | None = None) -> subprocess.Popen:
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    return subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "platform" / "sweep.py"),
            "--config",
            str(tmp_path / "sweep.yaml"),
            "--out",
            str(tmp_path / "results"),
            *flags,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )


def finish(process: subprocess.Popen, timeout: float = 400) -> str:
    """Wait for a sweep that ends normally; nothing of Ray's workers (log lines Ray held back, a worker's SIGTERM
    traceback) is printed after the script's last line."""
    output, _ = process.communicate(timeout=timeout)
    assert process.returncode == 0, output[-4000:]
    last = output.strip().splitlines()[-1]
    assert "trials finished; results in" in last or "is finished: nothing to do" in last, output[-4000:]
    return output


def descendants(pid: int) -> dict[int, str]:
    """Every process below `pid`, with its command line (from /proc)."""
    parents, commands = {}, {}
    for entry in os.listdir("/proc"):
        try:
            stat = open(f"/proc/{entry}/stat").read()
            commands[int(entry)] = open(f"/proc/{entry}/cmdline").read().replace("\0", " ")
        except (ValueError, OSError):
            continue
        parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = {}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parents.items():
            if ppid == parent and child not in found:
                found[child] = commands[child]
                frontier.append(child)
    return found


def kill_tree(process: subprocess.Popen) -> None:
    """SIGKILL the driver and every process it started (its Ray too), as a crash would."""
    for child in descendants(process.pid):
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def wait_for(condition, timeout: float = 300) -> None:
    end = time.time() + timeout
    while not condition():
        assert time.time() < end, "timed out"
        time.sleep(0.5)


def check_results(results) -> None:
    """The schema every reader relies on, and each (method, n, seed, update) exactly once."""
    trials = pq.read_table(results / "trials.parquet").to_pylist()
    assert sorted((r["method"], r["status"], r["updates"]) for r in trials) == [
        ("hpo", "completed", UPDATES),
        ("ppo", "completed", UPDATES),
    ]
    for r in trials:
        greedy = read_evaluation(results / "trials" / f"{r['method']}-n1-s0" / "greedy")["summary"]
        assert r["greedy_mean"] == greedy["mean"] and greedy["episodes"] == 8 and r["transitions_per_second"] > 0
    curves = pq.read_table(results / "curves.parquet").to_pylist()
    for method in ("hpo", "ppo"):
        assert [c["update"] for c in curves if c["method"] == method] == list(range(1, UPDATES + 1))
    baselines = {r["name"]: r for r in pq.read_table(results / "baselines.parquet").to_pylist()}
    assert set(baselines) == {"classical-best", "dp-optimal", "bound", "milp-highs"}
    assert baselines["bound"]["mean"] < min(baselines["classical-best"]["mean"], baselines["dp-optimal"]["mean"])
    assert baselines["milp-highs"]["seconds_per_decision"] > 0 and baselines["milp-highs"]["horizon"] == 3
    sweep = json.loads((results / "sweep.json").read_text())
    assert sweep["sweep"] == SWEEP and sweep["instance_hashes"].keys() == {"n1"} and sweep["finished"] and sweep["versions"]["ray"]


@pytest.mark.slow
def test_a_killed_driver_resumes_without_losing_or_repeating_anything(tmp_path):
    results = tmp_path / "results"
    first = start(tmp_path, SWEEP)
    wait_for(lambda: (results / "trials" / "hpo-n1-s0" / "sampled" / "summary.json").exists() or first.poll() is not None)
    kill_tree(first)
    finished = {
        p: p.stat().st_mtime_ns for p in [*results.glob("baselines/n1/*/summary.json"), *results.glob("trials/hpo-n1-s0/**/*.json")]
    }
    assert finished, "the first trial and the baselines were done before the kill"
    output = finish(start(tmp_path, SWEEP, "--resume"))
    assert "1 trials to run (1 finished)" in output
    assert {p: p.stat().st_mtime_ns for p in finished} == finished  # nothing finished was run again
    check_results(results)
    again = finish(start(tmp_path, SWEEP, "--resume"))
    assert "is finished: nothing to do" in again


@pytest.mark.slow
def test_a_trial_killed_mid_training_is_retried_from_its_checkpoint(tmp_path):
    """The trial's process is killed while held (a gate, tests/helpers.py) just after its first checkpoint (update
    50 of 600), however fast it trains; the retry's attempt starts from a checkpoint's update (training.json's
    attempts), so it makes the remaining updates only."""
    results, updates, every = tmp_path / "results", 600, 50
    sweep = {
        **SWEEP,
        "methods": ["hpo"],
        "baselines": {"classical_best": False, "dp_optimal": False},
        "overrides": {"all": {**SWEEP["overrides"]["all"], "updates": updates}, "hpo": {"checkpoint_every": every, "imitation_updates": 0}},
    }
    gate = Gate(tmp_path / "gate", call=("trainers.checkpoint:save_checkpoint", "after", 2))  # best.pt, then checkpoint.pt: then it waits
    process = start(tmp_path, sweep, env=gate.env)
    folder = results / "trials" / "hpo-n1-s0"
    gate.wait(process, timeout=300)
    trial = []

    def one_trial_process() -> bool:  # Tune's trial actor (the process held at the gate)
        trial[:] = [pid for pid, command in descendants(process.pid).items() if command.startswith("ray::ImplicitFunc")]
        return len(trial) == 1

    wait_for(one_trial_process, timeout=120)
    os.kill(trial[0], signal.SIGKILL)
    assert not (folder / "training.json").exists(), "the kill came after the first attempt's training had ended"
    output = finish(process)
    assert "trial hpo-n1-s0 failed (attempt 1 of 3), retrying from its last checkpoint: " in output, output[-4000:]  # the console says so
    curve = pq.read_table(results / "curves.parquet").to_pylist()
    assert [c["update"] for c in curve] == list(range(1, updates + 1))
    assert pq.read_table(results / "trials.parquet").to_pylist()[0]["status"] == "completed"
    training = json.loads((folder / "training.json").read_text())
    first, second = training["attempts"]  # a retry from scratch would give [0]: one attempt of all 600 updates
    assert first == 0 and 0 < second < updates and second % every == 0, training["attempts"]  # the second made updates second+1..600 only


@pytest.mark.slow
def test_ctrl_c_says_how_to_resume_and_exits_130(tmp_path):
    """Ctrl-C (SIGINT to the driver's process group, as a terminal sends it) reaches the script, not Tune's own handler
    (which ended the run normally, with exit status 0 and a Tuner.restore hint): one `interrupted:` line with the
    exact command that resumes, exit status 130."""
    results = tmp_path / "results"
    sweep = {
        **SWEEP,
        "methods": ["hpo"],
        "overrides": {**SWEEP["overrides"], "all": {**SWEEP["overrides"]["all"], "updates": 10_000}},
        "baselines": {"classical_best": False, "dp_optimal": False},
    }
    process = start(tmp_path, sweep)
    wait_for(lambda: (results / "trials" / "hpo-n1-s0").exists() or process.poll() is not None)
    os.killpg(process.pid, signal.SIGINT)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 130, output[-4000:]
    resume = f"python platform/sweep.py --config {tmp_path / 'sweep.yaml'} --out {results} --resume"
    assert output.strip().splitlines()[-1] == f"interrupted: finished trials and baselines are kept in '{results}'; continue with: {resume}"
    assert "Tuner.restore" not in output and "Traceback" not in output and "trials finished" not in output, output[-4000:]
