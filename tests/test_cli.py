"""The scripts in platform/ end to end at n = 4."""

import json
import re

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import run_script

from envs.exogenous import HELDOUT_SEED, sample_paths
from envs.instance import Instance, paper_instance
from policies.classical import FAMILIES, POLICY_NAMES
from policies.names import CHECKPOINT_PREFIX, NAMED_POLICIES, TABLES_PREFIX


def script(name, *args, check=True):
    return run_script(name, *args, check=check)


def test_evaluate_help_names_every_policy():
    """evaluate.py --help lists every named policy (policies.names.NAMED_POLICIES) whole, and the two prefixes."""
    help_text = " ".join(script("evaluate.py", "--help").stdout.split())
    listed = set(re.findall(r"[a-z][a-z-]*[a-z]", help_text))
    assert set(NAMED_POLICIES) <= listed, set(NAMED_POLICIES) - listed
    assert f"{TABLES_PREFIX}DIR" in help_text and f"{CHECKPOINT_PREFIX}PATH" in help_text


def test_instance_and_evaluate_zero_policy_with_trace(tmp_path):
    inst_path, out = tmp_path / "inst.json", tmp_path / "zero"
    script("instance.py", "--n", 4, "--seed", 0, "--out", inst_path)
    script("evaluate.py", "--instance", inst_path, "--policy", "zero", "--episodes", 6, "--horizon", 7, "--out", out, "--trace")
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["policy"], summary["episodes"], summary["horizon"], summary["seed"]) == ("zero", 6, 7, HELDOUT_SEED)
    assert summary["manifest"]["config"]["n"] == 4 and summary["manifest"]["versions"]["torch"]
    # Independent reference: with no orders, I_t = mu - cumulative demand before t.
    inst = Instance.load(inst_path)
    paths = sample_paths(inst, HELDOUT_SEED, 6, 7)
    demand = paths.demand.double().numpy()
    post = inst.lam * (inst.lead + 1) - np.cumsum(demand, axis=1)
    step_cost = (inst.h * np.maximum(post, 0) + inst.b * np.maximum(-post, 0)).sum(-1)
    expected = (step_cost * 0.95 ** np.arange(7)).sum(1)
    costs = pq.read_table(out / "costs.parquet").to_pydict()
    assert costs["episode"] == list(range(6))
    np.testing.assert_allclose(costs["discounted_cost"], expected, rtol=1e-5)
    assert summary["mean"] == pytest.approx(expected.mean(), rel=1e-5)
    steps = pq.read_table(out / "steps.parquet").to_pydict()
    assert len(steps["t"]) == 6 * 7 and set(steps["open"]) == {0}
    np.testing.assert_allclose(np.array(steps["cost"]).reshape(6, 7), step_cost, rtol=1e-5)
    items = pq.read_table(out / "items.parquet").to_pydict()
    assert len(items["item"]) == 6 * 7 * 4
    inventory = np.array(items["inventory"]).reshape(6, 7, 4)
    np.testing.assert_allclose(inventory[:, 1:], post[:, :-1], rtol=1e-5)
    np.testing.assert_allclose(np.array(items["demand"]).reshape(6, 7, 4), demand)


def test_evaluate_classical_best_records_tuned_parameters(tmp_path):
    inst_path = tmp_path / "inst.json"
    paper_instance(4, 0).save(inst_path)
    script(
        "evaluate.py",
        "--instance",
        inst_path,
        "--policy",
        "classical-best",
        "--episodes",
        8,
        "--horizon",
        10,
        "--seed",
        3,
        "--out",
        tmp_path / "best",
    )
    summary = json.loads((tmp_path / "best" / "summary.json").read_text())
    variants = set(POLICY_NAMES) - {"zero", "classical-best"}
    parameters = summary["parameters"]
    assert summary["seed"] == 3 and parameters["family"] in variants and parameters["tuning_seconds"] > 0
    assert set(parameters) == {
        "family",
        *FAMILIES[parameters["family"].removesuffix("-factor")],
        "tuning_mean",
        "tuning_se",
        "tuning_seconds",
    }
    assert not (tmp_path / "best" / "steps.parquet").exists()


@pytest.mark.slow
def test_main_job_writes_what_evaluate_writes_for_each_classical_policy(tmp_path):
    """platform/main.py tunes each variant in its own Ray task; its classical-best and base-stock-factor folders hold
    what evaluate.py --policy NAME writes on the same instance, episodes and horizon: the same tuned family and
    parameters, tuning cost and held-out costs (up to the float sums of another torch thread count)."""
    script("main.py", "--n", 2, "--episodes", 4, "--horizon", 5, "--out", tmp_path / "main")
    for name in ("classical-best", "base-stock-factor"):
        script(
            "evaluate.py",
            "--instance",
            tmp_path / "main" / "instance.json",
            "--policy",
            name,
            "--episodes",
            4,
            "--horizon",
            5,
            "--out",
            tmp_path / name,
        )
        main, alone = (json.loads((folder / "summary.json").read_text()) for folder in (tmp_path / "main" / name, tmp_path / name))
        assert set(main["parameters"]) == set(alone["parameters"]) and main["parameters"]["family"] == alone["parameters"]["family"]
        for key, value in alone["parameters"].items():
            if key not in ("family", "tuning_seconds"):
                assert main["parameters"][key] == pytest.approx(value, rel=1e-5), (name, key)
        costs = [
            pq.read_table(folder / "costs.parquet").column("discounted_cost").to_numpy()
            for folder in (tmp_path / "main" / name, tmp_path / name)
        ]
        np.testing.assert_allclose(costs[0], costs[1], rtol=1e-5)


def test_item_table_import(tmp_path):
    """Each of five runs reads the table and exits with status 0. Catches Arrow's CSV reader starting its CPU thread
    pool, which aborted the interpreter's exit (SIGABRT, "terminate called without an active exception") in about a
    third of the runs."""
    table = tmp_path / "items.csv"
    table.write_text("h,b,lam,beta,lead,qbar\n1.0,9.0,3.0,0.2,2,12\n0.5,7.0,5.0,0.4,1,20\n")
    for run in range(5):
        script("instance.py", "--items", table, "--K", 20, "--gamma", 0.9, "--rho", 0.7, "--out", tmp_path / f"i{run}.json")
    inst = Instance.load(tmp_path / "i0.json")
    assert inst.n == 2 and inst.K == 20 and inst.lead.tolist() == [2, 1]


def test_an_existing_instance_file_is_replaced_only_with_overwrite(tmp_path):
    """instance.py refuses an existing --out and leaves it as it was; with --overwrite it writes the new instance."""
    path = tmp_path / "inst.json"
    paper_instance(2, 0).save(path)
    before = path.read_bytes()
    refused = run_script("instance.py", "--n", 3, "--out", path)
    assert refused.returncode == 2 and "exists: give --overwrite to replace it" in refused.stderr and path.read_bytes() == before
    script("instance.py", "--n", 3, "--out", path, "--overwrite")
    assert Instance.load(path).n == 3


def test_overwrite_replaces_a_run_of_another_kind_whole(tmp_path):
    """evaluate.py refuses a folder that holds a decomposition bound and leaves it as it was; with --overwrite no file of
    the bound is left beside the evaluation (a report would read its split.jsonl or lookahead/ as the evaluation's),
    and a file that is no run's stays."""
    inst, run = tmp_path / "inst.json", tmp_path / "run"
    paper_instance(2, 0).save(inst)
    for name in ("split.jsonl", "split.parquet", "summary.json", "costs.parquet", "equal-shares/summary.json", "lookahead/tables.json"):
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text('{"format": "or-transformer-platform/evaluation"}' if name.endswith("summary.json") else "{}")
    (run / "notes.txt").write_text("mine")
    before = sorted(str(p.relative_to(run)) for p in run.rglob("*"))
    args = ["--instance", inst, "--policy", "zero", "--episodes", 2, "--horizon", 3, "--out", run]
    refused = run_script("evaluate.py", *args)
    assert refused.returncode == 2 and "holds a decomposition bound (split.jsonl)" in refused.stderr
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*")) == before
    script("evaluate.py", *args, "--overwrite")
    assert sorted(p.name for p in run.iterdir()) == ["costs.parquet", "notes.txt", "summary.json"]
    assert json.loads((run / "summary.json").read_text())["policy"] == "zero"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--policy", "zero", "--episodes", "0"], "--episodes: expected an integer >= 1, got 0"),
        (["--policy", "magic"], "--policy: expected one of ['zero'"),
        (["--policy", "zero", "--instance-missing"], "unrecognized arguments"),
    ],
)
def test_bad_flags_give_one_clear_error(tmp_path, args, message):
    inst_path = tmp_path / "inst.json"
    paper_instance(2, 0).save(inst_path)  # as `instance.py --n 2` writes it (test_instance_and_evaluate_zero_policy_with_trace)
    result = run_script("evaluate.py", "--instance", inst_path, "--out", tmp_path / "o", *args)
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert "(see evaluate.py --help)" in lines[0]  # argparse's usage block is not printed
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("kind", ["input", "interrupt"])
def test_the_last_line_starts_its_own_line_after_a_progress_bar(kind, capsys, monkeypatch):
    """A script that fails while a progress bar's frame (ended by a carriage return) is the last output prints its
    `error:` or `interrupted:` line on a new line, so `grep '^error:'` finds it; after whole lines, no blank line."""
    import sys

    from cli.scripts import LineTracking, run_cli
    from plumbing.errors import InputError

    def failing(prefix):
        def main():
            sys.stderr.write(prefix)
            raise InputError("field 'x': expected 1") if kind == "input" else KeyboardInterrupt

        return main

    first = "error: field 'x': expected 1" if kind == "input" else "interrupted"
    for prefix, expected in (("\revaluate:  40%|####  | 2/5", f"evaluate:  40%|####  | 2/5\n{first}\n"), ("done\n", f"done\n{first}\n")):
        monkeypatch.setattr(sys, "stderr", LineTracking(sys.stderr))
        with pytest.raises(SystemExit) as stop:
            run_cli(failing(prefix))
        assert stop.value.code == (2 if kind == "input" else 130)
        assert capsys.readouterr().err == expected


def test_bad_instance_file_is_reported_and_nothing_written(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps({"K": 1, "gamma": 1.5, "rho": 0.5, "items": {"h": [1], "b": [1], "lam": [1], "beta": [0], "lead": [1], "qbar": [1]}})
    )
    result = run_script("evaluate.py", "--instance", bad, "--policy", "zero", "--out", tmp_path / "o")
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: instance file '{bad}': instance field 'gamma': expected a number in (0, 1), got 1.5"
    assert not (tmp_path / "o").exists()


def test_evaluate_dp_optimal_on_one_item_matches_its_own_value(tmp_path):
    """evaluate.py --policy dp-optimal: the simulated cost agrees with the DP's expected value (the DP's own
    accuracy is tested in test_dp_optimal.py; this checks the wiring, horizon included)."""
    paper_instance(1, 0).save(tmp_path / "i.json")
    script(
        "evaluate.py",
        "--instance",
        tmp_path / "i.json",
        "--policy",
        "dp-optimal",
        "--episodes",
        400,
        "--horizon",
        20,
        "--seed",
        5,
        "--out",
        tmp_path / "dp",
    )
    summary = json.loads((tmp_path / "dp" / "summary.json").read_text())
    assert summary["policy"] == "dp-optimal" and summary["horizon"] == 20
    assert abs(summary["mean"] - summary["parameters"]["expected_cost"]) < 3 * summary["se"] + 1.0


def test_evaluate_dp_optimal_on_two_items_brackets_its_own_value(tmp_path):
    """evaluate.py --policy dp-optimal at n = 2 runs the joint DP (policies/joint_dp.py): its orders within the real caps,
    its value with the caps lowered and the relaxation's lower figure below it (fractional caps), the simulated cost
    within 3 s.e. and a grid allowance of the policy's value."""
    Instance(h=[1.0, 0.7], b=[8.0, 6.0], lam=[1.5, 1.2], beta=[0.4, 0.3], lead=[1, 2], qbar=[5.5, 4.5], K=8.0, gamma=0.9, rho=0.6).save(
        tmp_path / "i.json"
    )
    flags = ("--policy", "dp-optimal", "--episodes", 300, "--horizon", 8)
    script("evaluate.py", "--instance", tmp_path / "i.json", *flags, "--out", tmp_path / "dp")
    summary = json.loads((tmp_path / "dp" / "summary.json").read_text())
    figures = summary["parameters"]
    assert figures["caps"] == "lowered" and not figures["exact"]
    assert figures["relaxed_expected_cost"] < figures["expected_cost"]
    assert abs(summary["mean"] - figures["expected_cost"]) < 3 * summary["se"] + 0.02 * figures["expected_cost"]


def test_a_count_is_plural_unless_one():
    from cli.scripts import count

    assert (count(1, "window"), count(0, "window"), count(3, "episode")) == ("1 window", "0 windows", "3 episodes")


def test_instance_warns_of_a_cap_below_the_mean_demand(tmp_path):
    """An item table with qbar below lam is written as given, with one warning naming the item (the bound and dp-optimal
    refuse such an item later); a table without one gets no warning."""
    (tmp_path / "items.csv").write_text("h,b,lam,beta,lead,qbar\n1,9,5,0.3,1,20\n1,9,6,0.3,2,4.5\n1,9,2,0.3,1,1.5\n")
    flags = ("--K", 10, "--gamma", 0.95, "--rho", 0.8)
    result = run_script("instance.py", "--items", tmp_path / "items.csv", *flags, "--out", tmp_path / "i.json", check=True)
    assert result.stderr.strip() == (
        "warning: item 1 (and 1 more): order cap qbar 4.5 below its mean demand lam 6 per period: no policy keeps up with "
        "its demand; dp-optimal, the decomposition bound and its lookahead refuse such an item (the instance is written as given)"
    )
    assert Instance.load(tmp_path / "i.json").qbar.tolist() == [20.0, 4.5, 1.5]
    (tmp_path / "fine.csv").write_text("h,b,lam,beta,lead,qbar\n1,9,5,0.3,1,20\n")
    fine = run_script("instance.py", "--items", tmp_path / "fine.csv", *flags, "--out", tmp_path / "f.json", check=True)
    assert fine.stderr.strip() == ""


def test_progress_frames_become_lines_in_a_log_and_stay_frames_on_a_terminal(monkeypatch):
    """Into a stream that is not a terminal, a bar's frames (writes starting with a carriage return) become lines: the first
    at once, then at most one per LOG_FRAME_SECONDS (the clock stubbed), and the frame a bar ends on before the newline that
    ends it; a cleared bar (spaces) writes nothing. On a terminal every write passes as it is."""
    import io

    from cli import scripts

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    clock = iter([0.0, 5.0, 10.0, 31.0, 40.0])
    monkeypatch.setattr(scripts.time, "monotonic", lambda: next(clock))
    log, terminal = io.StringIO(), Terminal()
    frames = ["\rbar:  10%", "\rbar:  20%", "\rbar:  30%", "\rbar:  80%", "\rbar: 100%", "\n", "\r     \r", "done\n"]
    for stream in (scripts.LineTracking(log), scripts.LineTracking(terminal)):
        for text in frames:
            stream.write(text)
    assert log.getvalue() == "bar:  10%\nbar:  80%\nbar: 100%\ndone\n"
    assert terminal.getvalue() == "".join(frames)
