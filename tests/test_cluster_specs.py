"""The cluster specs in platform/ (docs/cluster.md): the Ray cluster launcher file passes the schema that Ray ships
and `ray up`'s own validation, and the KubeRay RayJob runs a script and a sweep file that exist, writing its
results where every pod mounts the same volume. Both set token authentication explicitly and use the Ray that
is installed here (the clients' Ray)."""

import json
import shlex
from pathlib import Path

import jsonschema
import pytest
import ray
import yaml
from conftest import ROOT

CLUSTER = ROOT / "platform/cluster.yaml"
RAYJOB = ROOT / "platform/rayjob.yaml"


@pytest.fixture(scope="module")
def cluster() -> dict:
    return yaml.safe_load(CLUSTER.read_text())


@pytest.fixture(scope="module")
def rayjob() -> dict:
    return yaml.safe_load(RAYJOB.read_text())


def test_the_launcher_file_validates_against_rays_schema_and_up_s_checks(cluster):
    from ray.autoscaler._private.util import prepare_config, validate_config

    schema = json.loads((Path(ray.__file__).parent / "autoscaler/ray-schema.json").read_text())
    jsonschema.validate(cluster, schema)
    validate_config(prepare_config(cluster))  # what `ray up` runs: defaults merged, node types and worker counts checked


def test_the_launcher_file_has_a_head_a_gpu_group_and_a_cpu_group(cluster):
    types = cluster["available_node_types"]
    assert cluster["head_node_type"] in types
    workers = {name: t["node_config"]["InstanceType"] for name, t in types.items() if name != cluster["head_node_type"]}
    assert any(kind.startswith(("g", "p")) for kind in workers.values()), workers  # AWS GPU families
    assert any(kind.startswith(("c", "m")) for kind in workers.values()), workers  # AWS CPU families


def test_the_launcher_file_installs_the_project_with_cpu_or_gpu_torch_and_the_clients_ray(cluster):
    setup = "\n".join(cluster["setup_commands"])
    assert cluster["file_mounts"]["~/or-transformer"] == "."
    assert f'"ray[default]=={ray.__version__}" ~/or-transformer' in setup
    assert "download.pytorch.org/whl/cpu" in setup and "nvidia-smi" in setup


def test_every_node_starts_ray_with_token_auth_and_the_dashboard_on_loopback(cluster):
    starts = [c for c in cluster["head_start_ray_commands"] + cluster["worker_start_ray_commands"] if "ray start" in c]
    assert len(starts) == 2
    assert all("RAY_AUTH_MODE=token ray start" in c for c in starts)
    assert "--dashboard-host=127.0.0.1" in starts[0]
    assert cluster["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"  # one token for every node


def test_the_rayjob_runs_an_existing_script_on_an_existing_sweep_file(rayjob):
    assert (rayjob["apiVersion"], rayjob["kind"]) == ("ray.io/v1", "RayJob")
    python, script, *args = shlex.split(rayjob["spec"]["entrypoint"])
    options = dict(zip(args[::2], args[1::2]))
    assert python == "python" and set(options) == {"--config", "--out"}
    assert (ROOT / script).is_file(), f"{script} does not exist"
    assert (ROOT / options["--config"]).is_file(), f"{options['--config']} does not exist"
    assert isinstance(yaml.safe_load((ROOT / options["--config"]).read_text()), dict)

    out = Path(options["--out"])
    assert out.is_absolute()
    cluster = rayjob["spec"]["rayClusterSpec"]
    templates = [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
    for template in templates:  # the results volume is mounted at the same place in every pod
        mounts = [m["mountPath"] for c in template["spec"]["containers"] for m in c["volumeMounts"]]
        assert any(out.is_relative_to(m) for m in mounts), mounts


def test_the_rayjob_ships_its_code_and_sets_token_auth_everywhere(rayjob):
    spec = rayjob["spec"]
    runtime_env = yaml.safe_load(spec["runtimeEnvYAML"])
    assert runtime_env["working_dir"].endswith(".zip")
    assert any(runtime_env["working_dir"] in package for package in runtime_env["pip"]["packages"])  # one commit
    cluster = spec["rayClusterSpec"]
    containers = [
        c
        for t in [spec["submitterPodTemplate"], cluster["headGroupSpec"]["template"], *[g["template"] for g in cluster["workerGroupSpecs"]]]
        for c in t["spec"]["containers"]
    ]
    for env in [c["env"] for c in containers] + [cluster["autoscalerOptions"]["env"]]:
        values = {e["name"]: e.get("value") or e.get("valueFrom") for e in env}
        assert values["RAY_AUTH_MODE"] == "token"
        assert values["RAY_AUTH_TOKEN"] == {"secretKeyRef": {"name": "ray-auth-token", "key": "token"}}
    assert cluster["rayVersion"] == ray.__version__
    assert all(c["image"].startswith(f"rayproject/ray:{ray.__version__}-py311") for c in containers)
