"""What a sweep prints (sweeps/console.py): one line per finished, retried or failed trial and per lost node; a
sweep's console without Ray's chatter, which goes to sweep.log; the dashboard of the embedded Ray on loopback only;
the TensorBoard folder it names holds every trial's events."""

import json
import os
import re
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import ROOT
from helpers import descendants, is_loopback, listeners_of, machine_addresses, reachable

from sweeps import console


class FakeTrial(SimpleNamespace):
    """What TrialLines reads of a Tune trial."""

    def __str__(self):
        return self.name


def fake_trial(name: str, failures: int = 0, error: str = None, tmp_path: Path = None, **result) -> FakeTrial:
    """A trial with `result` as its last result; with `error`, an error file that ends with it, as Tune writes one."""
    error_file = None
    if error is not None:
        error_file = tmp_path / f"{name}-error.txt"
        error_file.write_text(
            f'Failure # {failures} (occurred at 2026-01-01_00-00-00)\nTraceback (most recent call last):\n  File "x.py"\n{error}\n\n'
        )
    return FakeTrial(
        name=name,
        run_metadata=SimpleNamespace(num_failures=failures),
        last_result=result,
        error_file=error_file and str(error_file),
        status="TERMINATED" if error is None else "ERROR",
    )


def test_one_line_per_finished_retried_or_failed_trial_with_its_error(tmp_path):
    lines = []
    callback = console.TrialLines(lines.append, retries=2)
    done = fake_trial("hpo-n1-s0", update=20, greedy_mean=467.742, time_total_s=71.6)
    retried = fake_trial("ppo-n4-s1", failures=1, error="ray.exceptions.ActorDiedError: The actor died unexpectedly", tmp_path=tmp_path)
    failed = fake_trial("ppo-n4-s0", failures=3, error="ValueError: cost is nan", tmp_path=tmp_path, update=7)
    callback.on_trial_complete(0, [], done)
    callback.on_trial_recover(0, [], retried)
    callback.on_trial_error(0, [], failed)
    callback.on_experiment_end([done, failed])
    assert lines == [
        "trial hpo-n1-s0 finished: 20 updates, greedy cost 467.7, 72 s",
        "trial ppo-n4-s1 failed (attempt 1 of 3), retrying from its last checkpoint: ray.exceptions.ActorDiedError: The actor "
        "died unexpectedly",
        f"trial ppo-n4-s0 failed after 3 attempts, no retry left: ValueError: cost is nan (details: {tmp_path / 'ppo-n4-s0-error.txt'})",
        "trial      status      failures  updates  greedy cost",
        "hpo-n1-s0  TERMINATED         0       20        467.7",
        "ppo-n4-s0  ERROR              3        7             ",
    ]


def test_a_lost_node_is_said_once(monkeypatch):
    answers = iter([[("a", True), ("b", True)], [("a", True), ("b", True)], [("a", True), ("b", False)], [("a", True), ("b", False)]])
    monkeypatch.setattr(
        console.ray,
        "nodes",
        lambda: [
            {"NodeID": f"{n}" * 20, "Alive": alive, "NodeManagerAddress": f"10.0.0.{n}", "NodeName": f"worker-{n}"}
            for n, alive in next(answers)
        ],
    )
    monkeypatch.setattr(console, "NODE_CHECK_SECONDS", 0.0)
    lines = []
    callback = console.TrialLines(lines.append, retries=0)
    for _ in range(4):
        callback.on_step_begin(0, [])
    assert lines == [f"node worker-b ({'b' * 12}, 10.0.0.b) lost"]


def test_ray_chatter_goes_to_the_log_file_not_the_console(tmp_path, capfd):
    """What Ray's driver relays (worker output batches, as its log thread hands them to the stream dispatcher, and the
    raylet's messages to the job, as its error thread prints them), its loggers and Python warnings reach sweep.log
    and not the terminal."""
    import logging
    import warnings

    from ray._private import worker as ray_worker
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    loggers = {
        name: list(logging.getLogger(name).handlers)
        for name in ["ray", *(n for n in logging.root.manager.loggerDict if n.startswith("ray."))]
    }
    handlers, showwarning, raylet_printer = list(dispatcher.handlers), warnings.showwarning, ray_worker.print_to_stdstream
    log = console.SweepLog(tmp_path, verbose=False)
    try:
        assert (
            log.connect(lambda: dispatcher.add_handler("ray_print_logs", lambda batch: print(*batch["lines"]))) is None
        )  # as ray.init does
        dispatcher.emit(
            {
                "pid": 20634,
                "ip": "127.0.0.1",
                "actor_name": "PlacementGroupCleaner",
                "is_err": True,
                "lines": ["Failed to query Ray Train Controller actor state."],
            }
        )
        dispatcher.emit({"pid": 19163, "ip": "127.0.0.1", "actor_name": "SolverWorker", "is_err": False, "lines": ["Running HiGHS 1.16.0"]})
        logging.getLogger("ray.tune").error("Trial task failed for trial hpo-n1-s0")
        ray_worker.print_to_stdstream(  # as the driver's thread listen_error_messages prints the raylet's messages
            {"lines": ["WARNING: 8 PYTHON worker processes have been started on node: 4f2a"], "pid": "raylet", "is_err": False},
            ignore_prefix=False,
        )
        warnings.warn("`RLModule(config=...)` has been deprecated", DeprecationWarning, stacklevel=2)
    finally:
        log.close()
        dispatcher.handlers, warnings.showwarning = handlers, showwarning  # as before, also if close() did not
        ray_worker.print_to_stdstream = raylet_printer
        for name, kept in loggers.items():
            logging.getLogger(name).handlers = kept
    printed = capfd.readouterr()
    assert printed.out == printed.err == ""
    written = (tmp_path / console.LOG_NAME).read_text()
    assert "(PlacementGroupCleaner pid=20634, ip=127.0.0.1) Failed to query Ray Train Controller actor state.\n" in written
    assert "(SolverWorker pid=19163, ip=127.0.0.1) Running HiGHS 1.16.0\n" in written
    assert "( pid=raylet, ip=None) WARNING: 8 PYTHON worker processes have been started on node: 4f2a\n" in written
    assert "ERROR ray.tune: Trial task failed for trial hpo-n1-s0" in written and "DeprecationWarning: `RLModule(config=...)`" in written


def test_leaving_the_sweep_log_puts_back_what_it_replaced(tmp_path, capfd):
    """Catches a SweepLog that leaves Python's warning printer, the handlers of Ray's loggers or Ray's handler of worker
    output replaced after it is done: a warning after discard() raised AttributeError (the printer wrote to the closed
    log), and Ray's records and its workers' output went nowhere."""
    import logging
    import warnings

    from ray._private import worker as ray_worker
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    names = ["ray", *(n for n in logging.root.manager.loggerDict if n.startswith("ray."))]
    loggers = {name: list(logging.getLogger(name).handlers) for name in names}
    handlers, showwarning, raylet_printer = list(dispatcher.handlers), warnings.showwarning, ray_worker.print_to_stdstream

    def ray_printer(batch):  # as ray.init installs its printer of the workers' output
        print(*batch["lines"])

    try:
        with console.SweepLog(tmp_path / "out", verbose=False) as log:
            log.connect(lambda: dispatcher.add_handler("ray_print_logs", ray_printer))
            assert warnings.showwarning != showwarning and ("ray_print_logs", ray_printer) not in dispatcher.handlers  # it routed
            log.discard(made=True)
            with warnings.catch_warnings():  # not pytest.warns: its recorder would bypass the printer in place
                warnings.simplefilter("always")
                warnings.warn("after the sweep", UserWarning, stacklevel=1)  # raised AttributeError
            assert not (tmp_path / "out").exists()
        assert warnings.showwarning == showwarning and ray_worker.print_to_stdstream is raylet_printer
        assert {name: logging.getLogger(name).handlers for name in names} == loggers
        assert [(name, h) for name, h in dispatcher.handlers if name == "ray_print_logs"] == [("ray_print_logs", ray_printer)]
        dispatcher.emit({"pid": 1, "ip": "127.0.0.1", "actor_name": "SolverWorker", "is_err": False, "lines": ["Running HiGHS"]})
        assert capfd.readouterr().out == "Running HiGHS\n"
    finally:
        dispatcher.handlers, warnings.showwarning, ray_worker.print_to_stdstream = handlers, showwarning, raylet_printer
        for name, kept in loggers.items():
            logging.getLogger(name).handlers = kept


# ---- a real sweep ----------------------------------------------------------------------------------------------------

SWEEP = {  # a Ray Train method and an RLlib one, and a HiGHS MILP: each of Ray's talkers
    "sizes": [1],
    "seeds": 1,
    "methods": ["hpo", "ppo"],
    "overrides": {
        "all": {"batch": 8, "updates": 6, "blocks": 1, "width": 16, "heads": 2, "feed_forward": 32, "hidden": 32},
        "hpo": {"checkpoint_every": 3, "imitation_updates": 0},
    },
    "resources": {"all": {"workers": 1, "cpus_per_worker": 1}},
    "evaluation": {"episodes": 8, "horizon": 10},
    "baselines": {
        "classical_best": True,
        "dp_optimal": False,
        "milp": [{"scenarios": 3, "plan_horizon": 5, "time_limit": 2, "episodes": 2, "horizon": 3}],
    },
    "concurrency": 2,
    "retries": 1,
}
CHATTER = ["Running HiGHS", "RayTrainWorker", "TrainController", "Started a local Ray instance"]
"""Lines of Ray and its workers seen on the console before (a HiGHS banner, Ray Train's actors, ray.init's own)."""
SILENCED = ["Token authentication is enabled"]
"""Lines of Ray that a successful run does not show at all (ray_access.session.start_local_ray)."""


def console_lines(output: str) -> int:
    """Lines that are not progress-bar redraws: tqdm redraws a bar with carriage returns and ends it with one newline."""
    return output.count("\n")


def get_json(url: str, token: str = None):
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


def scalar_tags(events: Path) -> set[str]:
    """The scalar tags of a TensorBoard event file (TFRecord frames of Event protos, read with tensorboardX's)."""
    from tensorboardX.proto.event_pb2 import Event

    data, tags, at = events.read_bytes(), set(), 0
    while at < len(data):
        (length,) = struct.unpack("<Q", data[at : at + 8])
        event = Event.FromString(data[at + 12 : at + 12 + length])
        tags |= {value.tag for value in event.summary.value}
        at += 12 + length + 4
    return tags


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/net/fib_trie").exists(), reason="reads this machine's addresses from Linux /proc")
def test_a_sweep_prints_few_lines_and_shows_its_dashboard_on_loopback_only(tmp_path):
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(SWEEP))
    results, output_file = tmp_path / "results", tmp_path / "console.txt"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE")}
    with output_file.open("w") as output:
        sweep = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "platform" / "sweep.py"),
                "--config",
                str(tmp_path / "sweep.yaml"),
                "--out",
                str(results),
                "--dashboard",
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
            env={**env, "OMP_NUM_THREADS": "1"},
        )
    try:
        end, url, seen = time.time() + 300, None, {}
        while not {"job", "trial"} <= seen.keys():
            assert time.time() < end and sweep.poll() is None, output_file.read_text()[-3000:]
            time.sleep(1)
            url = url or next(iter(re.findall(r"Ray dashboard: (http://127\.0\.0\.1:\d+) ", output_file.read_text())), None)
            if url is None:
                continue
            token = (results / "dashboard-token").read_text().strip()
            try:
                jobs = get_json(f"{url}/api/jobs/", token)
                actors = get_json(f"{url}/api/v0/actors?limit=1000", token)["data"]["result"]["result"]
            except OSError:  # a dashboard still starting (or slow on a loaded machine) closes or refuses: ask again
                continue
            seen |= {"job": jobs} if any(job["driver_info"]["pid"] == str(sweep.pid) for job in jobs if job.get("driver_info")) else {}
            seen |= {"trial": actors} if any(a["class_name"].endswith("ImplicitFunc") for a in actors) else {}  # Tune's trial actors
        with pytest.raises(urllib.error.HTTPError) as refused:
            get_json(f"{url}/api/jobs/")
        assert refused.value.code in (401, 403)  # the token guards the dashboard
        port = int(url.rsplit(":", 1)[1])
        others = machine_addresses()
        assert others, "this machine has no address but loopback: nothing to check"
        assert [address for address in others if reachable(*address, port)] == []
        assert reachable(socket.AF_INET, "127.0.0.1", 0, port)
        listeners, end = set(), time.time() + 60  # one snapshot of /proc/net/tcp{,6} is not atomic: the union of several
        while not {"gcs_server", "raylet"} <= {name for name, _ in listeners} and time.time() < end and sweep.poll() is None:
            listeners |= set(listeners_of([sweep.pid, *descendants(sweep.pid)]))
            time.sleep(0.1)  # between snapshots (the loop ends on what it sees)
        assert {"gcs_server", "raylet"} <= {name for name, _ in listeners}, listeners  # the check saw Ray
        assert [(name, address) for name, address in listeners if not is_loopback(address)] == []
        assert sweep.wait(timeout=400) == 0, output_file.read_text()[-3000:]
    finally:
        sweep.kill()
        sweep.wait()
    with output_file.open(newline="") as file:  # keep the progress bars' carriage returns
        output = file.read()
    assert output.strip().splitlines()[-1].startswith("2 of 2 trials finished"), output[-3000:]
    assert "trial hpo-n1-s0 finished: 6 updates" in output and "trial ppo-n1-s0 finished: 6 updates" in output
    assert console_lines(output) <= 20, output
    log = (results / "sweep.log").read_text()
    for chatter in CHATTER:
        assert chatter not in output and chatter in log, chatter
    for line in SILENCED:
        assert line not in output and line not in log, line
    logdir = re.search(r"TensorBoard: tensorboard --logdir (\S+)", output).group(1)
    for trial in ("hpo-n1-s0", "ppo-n1-s0"):
        assert "ray/tune/cost10" in set().union(*map(scalar_tags, Path(logdir).glob(f"trials-1/{trial}/events.out.tfevents.*"))), trial
