"""Sweep files: validation before anything starts, the trial grid, the dry run, and the refusal to mix
two sweeps in one results directory."""

import re
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, run_script

from plumbing.errors import InputError
from plumbing.files import read_file
from policies.decomposition import DecompositionOptions
from sweeps.results_dir import open_results
from sweeps.runner import dry_run, read_spec
from sweeps.spec import SweepError, SweepSpec
from trainers.registry import method_config

MINIMAL = {"sizes": [1, 4], "seeds": 2, "methods": ["hpo", "ppo"]}


def test_the_shipped_sweep_files_are_valid_and_expand_as_documented():
    quick, _ = read_spec(ROOT / "tune_configs" / "quick.yaml")
    assert len(quick.trials()) == 4 * 2 * 2 and quick.sizes == (1, 4)
    assert quick.baselines.decomposition is not None and quick.baselines.lookahead  # make run's headline: the bound, the lookahead
    paper, data = read_spec(ROOT / "tune_configs" / "paper.yaml")
    assert SweepSpec.from_dict(data) == paper  # as read back from sweep.json (string keys)
    per_size = {n: sum(t.n == n for t in paper.trials()) for n in paper.sizes}
    assert per_size == {1: 4 * 30, 4: 4 * 30, 16: 4 * 30, 64: 4 * 30, 1024: 4}  # 30 seeds, one at n = 1,024
    long = [m for m in paper.baselines.milp if m.sizes == (1024,)]
    assert len(long) == 1 and long[0].horizon == 8 and long[0].time_limit == 6 * 3600
    cpu, _ = read_spec(ROOT / "tune_configs" / "cpu.yaml")
    assert cpu.sizes == (1, 4, 16) and cpu.seeds == (0, 1, 2, 3, 4) and cpu.preset == "cpu"
    beat, _ = read_spec(ROOT / "tune_configs" / "beat-classical.yaml")  # docs/experiments.md: the cpu preset as it is
    assert (beat.preset, beat.sizes, beat.seeds, beat.overrides_of("or-transformer")) == ("cpu", (4, 16), (0, 1, 2), {})


@pytest.mark.parametrize("path", sorted((ROOT / "tune_configs").glob("**/*.yaml")), ids=lambda path: path.name)
def test_every_shipped_config_file_is_valid(path):
    if path.parent.name == "train":  # training config files: fields over a preset (platform/train.py --config)
        method_config("or-transformer", "cpu", read_file(path, "config file"))  # the loader platform/train.py uses
    else:
        read_spec(path)


def test_trials_seeds_and_scoped_overrides():
    spec = SweepSpec.from_dict(
        {
            **MINIMAL,
            "seeds": [3, 7],
            "overrides": {"all": {"updates": 5}, "hpo": {"updates": 9, "batch": 8}},
            "resources": {"ppo": {"workers": 0, "cpus_per_worker": 2}},
        }
    )
    assert [t.name for t in spec.trials()] == [
        "hpo-n1-s3",
        "hpo-n1-s7",
        "ppo-n1-s3",
        "ppo-n1-s7",
        "hpo-n4-s3",
        "hpo-n4-s7",
        "ppo-n4-s3",
        "ppo-n4-s7",
    ]
    assert spec.overrides_of("hpo") == {"updates": 9, "batch": 8} and spec.overrides_of("ppo") == {"updates": 5}
    assert spec.resources_of("ppo").cpus_per_worker == 2 and spec.resources_of("hpo").workers == 1


@pytest.mark.parametrize(
    "change, message",
    [
        ({"sizes": []}, "sweep field 'sizes': expected a non-empty list"),
        ({"sizes": [0, 4]}, "sweep field 'sizes': expected an integer in [1, 42075], got 0"),
        ({"sizes": [4, 4]}, "sweep field 'sizes': each entry once"),
        ({"seeds": 0}, "sweep field 'seeds': expected an integer in [1, 1000], got 0"),
        ({"seeds": [1, 1]}, "sweep field 'seeds': each seed once"),
        ({"seeds": "3"}, "sweep field 'seeds': expected a count >= 1 or a non-empty list"),
        ({"methods": ["or-transformers"]}, "sweep field 'methods': expected one of ['or-transformer', 'transformer-ppo', 'hpo', 'ppo']"),
        ({"methods": [], "baselines": {"classical_best": False, "dp_optimal": False}}, "the grid is empty"),
        ({"size": [1]}, "unknown keys ['size']; allowed keys are"),
        ({"overrides": {"hpo2": {}}}, "sweep field 'overrides': unknown keys ['hpo2']"),
        ({"resources": {"all": {"workers": -1}}}, "sweep field 'resources.all.workers': expected an integer >= 0"),
        ({"resources": {"all": {"gpus": 1}}}, "sweep field 'resources.all': unknown keys ['gpus']"),
        ({"evaluation": {"episodes": 0}}, "sweep field 'evaluation.episodes': expected an integer >= 1"),
        ({"baselines": {"bound": {"time_limit": 0}}}, "sweep field 'baselines.bound.time_limit': expected a number in (0, 604800], got 0"),
        ({"baselines": {"milp": [{"solver": "cplex"}]}}, "sweep field 'baselines.milp[0].solver': expected one of ['highs', 'gurobi']"),
        ({"baselines": {"milp": [{}, {}]}}, "names must differ"),
        ({"concurrency": 0}, "sweep field 'concurrency': expected an integer >= 1"),
        ({"retries": True}, "sweep field 'retries': expected an integer >= 0, got a boolean true"),
        ({"device": "tpu"}, "sweep field 'device': expected one of ['cpu', 'cuda']"),
        ({"seeds_per_size": {16: 1}}, "sweep field 'seeds_per_size': unknown keys [16]"),
        ({"resources": {"all": {"gpus_per_worker": 0.5}}}, "gpus_per_worker > 0 needs device: cuda"),
        ({"device": "cuda"}, "device: cuda needs gpus_per_worker > 0 for every method (Ray shows a trial no GPU it did not ask for), hpo"),
        (
            {"device": "cuda", "resources": {"hpo": {"gpus_per_worker": 1}}},
            "device: cuda needs gpus_per_worker > 0 for every method (Ray shows a trial no GPU it did not ask for), ppo has 0",
        ),
    ],
)
def test_bad_sweep_files_are_refused_naming_the_field(change, message):
    with pytest.raises(SweepError) as err:
        SweepSpec.from_dict({**MINIMAL, **change})
    assert message in str(err.value)


def test_dry_run_counts_trials_and_refuses_trials_larger_than_the_cluster():
    spec = SweepSpec.from_dict(
        {**MINIMAL, "device": "cuda", "resources": {"all": {"workers": 2, "cpus_per_worker": 1, "gpus_per_worker": 0.5}}}
    )
    lines = dry_run(spec, [{"CPU": 8, "GPU": 1}])
    assert lines[0].startswith("8 trials (2 methods x 2 sizes x 2 seeds)")
    assert (
        "hpo: 2 CPU, 1 GPU per trial (2 Ray Train workers)" in lines[1] and "ppo: 1 CPU, 0.5 GPU per trial (the trial process)" in lines[2]
    )
    with pytest.raises(
        InputError,
        match="a hpo trial trains on 2 Ray Train workers of 1 CPU and 0.5 GPU on one node each; "
        "the cluster's 1 node: 1 with 8 CPU and 0 GPU, room for 0",
    ):
        dry_run(spec, [{"CPU": 8, "GPU": 0}])


def test_a_results_directory_holds_one_sweep(tmp_path):
    out = tmp_path / "results"
    record = open_results(out, MINIMAL, resume=False)
    out.mkdir()
    (out / "sweep.json").write_text(__import__("json").dumps(record))
    with pytest.raises(InputError, match="holds another sweep"):
        open_results(out, {**MINIMAL, "seeds": 3}, resume=True)
    with pytest.raises(InputError, match="already holds this sweep: continue it with --resume"):
        open_results(out, MINIMAL, resume=False)
    assert open_results(out, MINIMAL, resume=True)["sweep"] == MINIMAL
    with pytest.raises(InputError, match="holds no sweep to resume"):
        open_results(tmp_path / "elsewhere", MINIMAL, resume=True)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="is not empty and holds no sweep"):
        open_results(tmp_path / "busy", MINIMAL, resume=False)


def test_sweep_script_dry_run_and_a_bad_file(tmp_path):
    ok = run_script("sweep.py", "--config", ROOT / "tune_configs" / "quick.yaml", "--out", tmp_path / "r", "--dry-run", check=True)
    assert "16 trials (4 methods x 2 sizes x 2 seeds)" in ok.stdout and not (tmp_path / "r").exists()
    bad = Path(tmp_path / "bad.yaml")
    bad.write_text(yaml.safe_dump({**MINIMAL, "methods": ["dqn"]}))
    result = run_script("sweep.py", "--config", bad, "--out", tmp_path / "r")
    assert result.returncode == 2 and "sweep field 'methods'" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "change, message",
    [
        ({"baselines": {"milp": [{"gap": 5}]}}, "sweep field 'baselines.milp[0].gap': expected a number in [0, 1), got 5 (a relative gap"),
        (
            {"baselines": {"milp": [{"scenarios": 10**12}]}},
            "sweep field 'baselines.milp[0].scenarios': expected an integer in [1, 10000], got 1000000000000 (",
        ),
        (
            {"baselines": {"milp": [{"plan_horizon": 10**9}]}},
            "sweep field 'baselines.milp[0].plan_horizon': expected an integer in [1, 10000], got 1000000000 (",
        ),
        (
            {"baselines": {"milp": [{"time_limit": 1e300}]}},
            "sweep field 'baselines.milp[0].time_limit': expected a number in (0, 604800], got 1e+300 (a week",
        ),
        (
            {"baselines": {"milp": [{"sizes": [100_000]}]}},
            "sweep field 'baselines.milp[0].sizes': expected an integer in [1, 42075], got 100000",
        ),
        ({"sizes": [100_000]}, "sweep field 'sizes': expected an integer in [1, 42075], got 100000 (the paper family has 42,075 distinct"),
        ({"seeds": [2**31]}, "sweep field 'seeds': expected an integer in [0, 2147483647], got 2147483648"),
        ({"instance_seed": 2**32 - 1}, "sweep field 'instance_seed': expected an integer in [0, 2147483647], got 4294967295"),
        ({"evaluation": {"horizon": 10**9}}, "sweep field 'evaluation.horizon': expected an integer in [1, 10000], got 1000000000"),
        ({"overrides": {"all": {"batch": 10**8}}}, "config field 'batch': expected an integer in [1, 65536], got 100000000 (memory"),
        (
            {"sizes": [4096], "baselines": {"milp": [{"scenarios": 10_000, "plan_horizon": 50}]}},
            "sweep field 'baselines.milp[0]': the rolling-horizon MILP of n = 4,096 items, S = 10,000 scenarios and H = 50 "
            "steps holds at least 8,110,080,000 non-zeros",
        ),
    ],
)
def test_every_sweep_value_is_bounded_with_its_reason(change, message):
    with pytest.raises(InputError) as err:
        SweepSpec.from_dict({**MINIMAL, **change})
    assert message in str(err.value)


def test_sweep_files_read_numbers_like_train_configs(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(
        "sizes: [1]\nseeds: 1\nmethods: [hpo]\noverrides: {all: {learning_rate: 5e-3}}\n"
        "baselines:\n  milp: [{gap: 5e-3, time_limit: 1e2}]\n"
    )
    spec, data = read_spec(path)
    assert (
        spec.overrides_of("hpo") == {"learning_rate": 0.005}
        and spec.baselines.milp[0].gap == 0.005
        and spec.baselines.milp[0].time_limit == 100.0
    )
    assert method_config("hpo", "cpu", spec.overrides_of("hpo")).learning_rate == 0.005
    path.write_text("sizes: [1]\nseeds: 1\nmethods: [hpo]\nseeds: 2\n")
    with pytest.raises(InputError, match=r"sweep file '.*s.yaml': key 'seeds' is written twice \(lines 2 and 4\)"):
        read_spec(path)


def test_the_dry_run_notes_a_gurobi_baseline_above_the_licence_exactly_where_milp_py_would():
    spec = SweepSpec.from_dict(
        {
            **MINIMAL,
            "baselines": {
                "milp": [
                    {"name": "g", "solver": "gurobi", "scenarios": 10, "plan_horizon": 10},
                    {"name": "h", "solver": "highs", "scenarios": 10, "plan_horizon": 10},
                ]
            },
        }
    )
    notes = [line for line in dry_run(spec, [{"CPU": 8, "GPU": 0}]) if "note:" in line]
    # n = 1: 2 S n H = 200 stock columns, under 2,000; n = 4: 800, also under; highs never
    assert notes == []
    spec = SweepSpec.from_dict(
        {**MINIMAL, "sizes": [4, 16], "baselines": {"milp": [{"name": "g", "solver": "gurobi", "scenarios": 10, "plan_horizon": 10}]}}
    )
    notes = [line for line in dry_run(spec, [{"CPU": 8, "GPU": 0}]) if "note:" in line]
    assert notes == [
        "g at n = 16: note: these Gurobi models hold at least 3,200 variables, above the PyPI licence's limit of 2,000 variables "
        "and constraints: without your own licence every solve is recorded with status 'licence-limit' and executes the zero fallback"
    ]


def test_resuming_with_another_sweep_file_names_every_field_that_differs(tmp_path):
    out = tmp_path / "results"
    out.mkdir()
    (out / "sweep.json").write_text(__import__("json").dumps(open_results(out, MINIMAL, resume=False)))
    other = {**MINIMAL, "seeds": 3, "baselines": {"milp": [{"gap": 0.01}]}}
    with pytest.raises(InputError) as err:
        open_results(out, other, resume=True)
    assert 'its sweep file differs from this one in baselines (absent) there, {"milp": [{"gap": 0.01}]} here; seeds 2 there, 3 here' in str(
        err.value
    )


def test_the_dry_run_estimates_milp_hours_only_for_a_sweep_with_milp_decisions():
    """Catches the dry run printing 'MILP decisions at most 0.0 solver-hours' for a sweep without a MILP baseline (or
    for a tiny one), and a wrong sum: one MILP at n = 1 and 4, 3 episodes x 5 steps at 60 s each = 2 x 15 x 60 s =
    0.5 solver-hours."""
    plain = dry_run(SweepSpec.from_dict(MINIMAL), [{"CPU": 8, "GPU": 0}])
    assert not [line for line in plain if "MILP" in line], plain
    spec = SweepSpec.from_dict({**MINIMAL, "baselines": {"milp": [{"time_limit": 60, "episodes": 3, "horizon": 5}]}})
    lines = [line for line in dry_run(spec, [{"CPU": 8, "GPU": 0}]) if "MILP" in line]
    assert lines == ["MILP decisions at most 0.5 solver-hours (every decision at its time limit)"]
    tiny = SweepSpec.from_dict({**MINIMAL, "baselines": {"milp": [{"time_limit": 2, "episodes": 2, "horizon": 4}]}})
    lines = [line for line in dry_run(tiny, [{"CPU": 8, "GPU": 0}]) if "MILP" in line]  # 2 sizes x 8 decisions x 2 s
    assert lines == ["MILP decisions at most 32 solver-seconds (every decision at its time limit)"]


@pytest.mark.parametrize(
    "grid, message",
    [
        ({"factor_points": 1}, "'baselines.decomposition.factor_points': expected an integer in [3, "),
        ({"factor_points": 10**8}, "'baselines.decomposition.factor_points': expected an integer in [3, "),
        ({"tolerance": 0}, "'baselines.decomposition.tolerance': expected a number > 0, got 0"),
        ({"schedule_rounds": -1}, "'baselines.decomposition.schedule_rounds': expected an integer >= 0, got -1"),
    ],
)
def test_a_sweep_file_refuses_the_decomposition_grids_that_bound_py_refuses(grid, message):
    """Catches the sweep file and bound.py following two rules: 10^8 factor points (a 10^16-entry Tauchen table) passed
    the sweep's dry run while the run died of a MemoryError, and tolerance 0 passed the file but not the flag."""
    with pytest.raises(SweepError, match=re.escape(message)):
        SweepSpec.from_dict({**MINIMAL, "baselines": {"decomposition": grid}})
    with pytest.raises(InputError, match=re.escape(message.split("'")[2].lstrip(": "))):
        DecompositionOptions(**{"factor_points": 41, "coarse_points": 21, **grid})


def test_a_sweep_exits_with_a_status_that_says_whether_its_trials_finished():
    """0 when every trial finished (a diverged one keeps its last checkpoint), 3 when some failed, 4 when none finished."""
    from sweeps.runner import NONE_FINISHED_EXIT, SOME_FAILED_EXIT, exit_status

    assert exit_status([{"status": "completed"}, {"status": "diverged"}]) == 0
    assert exit_status([{"status": "completed"}, {"status": "failed"}]) == SOME_FAILED_EXIT == 3
    assert exit_status([{"status": "failed"}, {"status": "failed"}]) == NONE_FINISHED_EXIT == 4


@pytest.mark.parametrize(
    "change, message",
    [
        ({"overrides": {"or-transformer": {"learning_rate": 1e-4}}}, "'overrides.or-transformer': or-transformer is not among"),
        ({"resources": {"transformer-ppo": {"cpus_per_worker": 2}}}, "'resources.transformer-ppo': transformer-ppo is not among"),
        ({"baselines": {"milp": [{"sizes": [4, 16]}]}}, "'baselines.milp[0].sizes': [16] not among the sweep's sizes [1, 4]"),
    ],
)
def test_a_setting_for_a_method_or_size_the_sweep_does_not_run_is_refused(change, message):
    """Overrides and resources of a method outside 'methods', and a MILP baseline at a size outside 'sizes', were dropped
    without a word; each is one SweepError naming the field. The same settings for a method or size of the sweep pass."""
    with pytest.raises(SweepError, match=re.escape(message)):
        SweepSpec.from_dict({**MINIMAL, **change})
    SweepSpec.from_dict({**MINIMAL, "overrides": {"hpo": {"learning_rate": 1e-4}}, "baselines": {"milp": [{"sizes": [4]}]}})


def test_an_unknown_preset_is_blamed_on_the_preset():
    """preset: turbo was reported as a fault of 'overrides' (the configs are built with the preset); it is the field 'preset'."""
    with pytest.raises(SweepError, match=re.escape("sweep field 'preset': expected one of ['paper', 'cpu'], got a string \"turbo\"")):
        SweepSpec.from_dict({**MINIMAL, "preset": "turbo"})
