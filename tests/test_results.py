"""Results folders are whole or not read: a killed re-run, a leftover temporary file, a modified file, a
summary of another format and a comparison across instances are all refused."""

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import run_script

import run_results.records as results
from envs.evaluation import Evaluation, evaluate
from envs.exogenous import sample_paths
from envs.instance import paper_instance
from plumbing.errors import InputError

INSTANCE = paper_instance(2, 0)


def evaluation(episodes: int, trace: bool = False) -> Evaluation:
    paths = sample_paths(INSTANCE, 11, episodes, 5)
    return evaluate(lambda s, inst: (s.factor * 0, s.inv * 0), INSTANCE.to_torch(), paths, trace=trace)


def write(folder, episodes: int, trace: bool = False) -> dict:
    return results.write_evaluation(folder, "zero", evaluation(episodes, trace), 11, {}, instance=INSTANCE)


def test_a_written_folder_reads_back_with_its_instance_and_costs(tmp_path):
    summary = write(tmp_path / "ev", 4, trace=True)
    run = results.read_evaluation(tmp_path / "ev")
    assert run["summary"] == json.loads((tmp_path / "ev" / "summary.json").read_text()) == summary
    assert summary["instance_hash"] == INSTANCE.content_hash() and summary["n"] == 2
    assert sorted(summary["files"]) == ["costs.parquet", "items.parquet", "steps.parquet"]
    np.testing.assert_array_equal(run["episodes"], [0, 1, 2, 3])
    np.testing.assert_allclose(run["cost"], pq.read_table(tmp_path / "ev" / "costs.parquet").column("discounted_cost").to_numpy())


def test_a_rerun_killed_midway_leaves_no_summary_beside_new_files(tmp_path, monkeypatch):
    folder = tmp_path / "ev"
    write(folder, 4, trace=True)
    real = results.write_parquet

    def killed_after_costs(table, path):
        if path.name == "steps.parquet":
            raise KeyboardInterrupt  # the writer dies between two files
        real(table, path)

    monkeypatch.setattr(results, "write_parquet", killed_after_costs)
    with pytest.raises(KeyboardInterrupt):
        write(folder, 8, trace=True)
    assert pq.read_table(folder / "costs.parquet").num_rows == 8  # the new costs were written ...
    assert not (folder / "summary.json").exists()  # ... but no summary vouches for them
    assert not list(folder.glob(".*"))  # and no temporary file is left
    with pytest.raises(InputError, match="incomplete"):
        results.read_evaluation(folder)


def test_leftover_temporary_files_are_removed_and_stale_traces_dropped(tmp_path):
    folder = tmp_path / "ev"
    write(folder, 4, trace=True)
    (folder / ".costs.parquet.tmp999").write_bytes(b"half a file")
    write(folder, 3)  # a re-run without --trace
    assert sorted(p.name for p in folder.iterdir()) == ["costs.parquet", "summary.json"]
    assert results.read_evaluation(folder)["summary"]["episodes"] == 3


def test_a_replaced_file_fails_its_checksum(tmp_path):
    write(tmp_path / "a", 4)
    write(tmp_path / "b", 4)
    other = evaluation(4)
    other = Evaluation(other.discounted_cost + 1.0, other.episodes, other.horizon)
    results.write_evaluation(tmp_path / "c", "zero", other, 11, {}, instance=INSTANCE)
    (tmp_path / "c" / "costs.parquet").replace(tmp_path / "a" / "costs.parquet")
    with pytest.raises(InputError, match="costs.parquet does not match its checksum"):
        results.read_evaluation(tmp_path / "a")
    results.read_evaluation(tmp_path / "b")


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "is not valid JSON"),
        ('{"policy": "zero"}', "not a results summary of this platform"),
        (json.dumps({"format": results.FORMAT, "version": 1}), "field 'version' is 1"),
    ],
)
def test_malformed_summaries_are_named(tmp_path, content, message):
    write(tmp_path / "ev", 4)
    (tmp_path / "ev" / "summary.json").write_text(content)
    with pytest.raises(InputError, match=message):
        results.read_evaluation(tmp_path / "ev")


def test_a_summary_missing_a_field_is_named(tmp_path):
    write(tmp_path / "ev", 4)
    summary = json.loads((tmp_path / "ev" / "summary.json").read_text())
    del summary["instance_hash"]
    (tmp_path / "ev" / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(InputError, match="field 'instance_hash' is missing"):
        results.read_evaluation(tmp_path / "ev")


@pytest.mark.slow
def test_report_refuses_to_pair_evaluations_of_different_instances(tmp_path):
    for n in (2, 4):
        run_script("instance.py", "--n", n, "--out", tmp_path / f"i{n}.json", check=True)
        run_script(
            "evaluate.py",
            "--instance",
            tmp_path / f"i{n}.json",
            "--policy",
            "zero",
            "--episodes",
            4,
            "--horizon",
            5,
            "--out",
            tmp_path / f"zero{n}",
            check=True,
        )
    same = run_script("report.py", tmp_path / "zero2", tmp_path / "zero2")
    assert same.returncode == 0, same.stderr
    mixed = run_script("report.py", tmp_path / "zero2", tmp_path / "zero4")
    assert mixed.returncode == 2 and "evaluate different instances" in mixed.stderr and "Traceback" not in mixed.stderr


def test_a_non_finite_cost_is_refused_before_the_folder_is_touched(tmp_path):
    folder = tmp_path / "ev"
    before = write(folder, 4)
    for bad in (np.nan, np.inf):
        broken = evaluation(4)
        broken.discounted_cost[2] = bad
        with pytest.raises(InputError, match=f"non-finite discounted cost in 1 of 4 episodes \\(first: episode 2, {bad}\\)"):
            results.write_evaluation(folder, "zero", broken, 11, {}, instance=INSTANCE)
        assert results.read_evaluation(folder)["summary"] == before  # the earlier result is still whole
        with pytest.raises(InputError, match="non-finite"):
            results.write_evaluation(tmp_path / "new", "zero", broken, 11, {}, instance=INSTANCE)
        assert not (tmp_path / "new").exists()
