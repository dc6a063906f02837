"""An embedded Ray beside another Ray on the same machine: every process of the session finds this session.
Ray's clients inside a session that are given no address (Ray Train's placement-group cleaner asks the state API
whether its controller lives) take RAY_ADDRESS, else the most recent Ray on the machine; without RAY_ADDRESS the
cleaner of one session connected to another session's cluster and died."""

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

OTHER = """
import sys
from ray_access.session import start_local_ray
start_local_ray(1, log_to_driver=False)
print("ready", flush=True)
sys.stdin.read()
"""

PROBE = """
import json, os, ray
from ray_access.session import start_local_ray

start_local_ray(1, log_to_driver=False)

@ray.remote(num_cpus=0)
def found():
    from ray._private import services
    return services.canonicalize_bootstrap_address(None)  # what a client given no address connects to

session = ray.get_runtime_context().gcs_address
print(json.dumps({"session": session, "worker": ray.get(found.remote()), "driver": os.environ.get("RAY_ADDRESS")}))
ray.shutdown()
"""


@pytest.mark.slow
def test_a_worker_of_an_embedded_session_finds_its_own_session_beside_another_ray():
    """Catches the session's processes resolving 'no address' to another Ray on the machine (or to none): a worker
    of the session must find exactly the session's GCS address, and the driver's own environment must not keep it
    (its later subprocesses would take a session that ends with it for a cluster). Both Rays run in processes of
    their own (the test process may hold the test session's Ray); only the one started here is stopped."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | {"PYTHONPATH": str(ROOT)}
    other = subprocess.Popen([sys.executable, "-c", OTHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        assert other.stdout.readline().strip() == "ready"
        probe = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
        assert probe.returncode == 0, probe.stderr[-3000:]
        record = json.loads(probe.stdout.strip().splitlines()[-1])
        assert record["worker"] == record["session"] and record["driver"] is None, record
    finally:
        other.stdin.close()
        try:
            other.wait(timeout=120)
        except subprocess.TimeoutExpired:
            other.kill()
            other.wait()
