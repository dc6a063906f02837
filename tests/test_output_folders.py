"""No output lands inside what its run reads or inside another run's folder (cli.output_folders.resolve_out,
docs/runs-and-results.md#errors): the cases of the issue through the real scripts on a real decomposition bound and a
real backtest, each refused in one line with every file of both folders unchanged (hashed before and after), and
the check itself on folders made by hand: every kind of run by its record file, and a user's tables and subfolders that
only share a run entry's name (items.parquet, greedy/) not taken for a run."""

import re

import pyarrow.csv
import pytest
from conftest import INSTANCE, digests, run_script

from cli.output_folders import resolve_out
from demand.simulation import simulate_history
from plumbing.errors import InputError

HORIZON = 10
"""The bound's horizon, also the evaluations' (decomposition-lookahead:DIR needs its bound's)."""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """INSTANCE (n = 2, lead times 3) with a decomposition bound of it in dec/ (bound.py, 2 episodes of HORIZON steps,
    coarse grids) and a backtest in bt/ (zero and base-stock on 60 periods of a history drawn from it, windows of 20)."""
    folder = tmp_path_factory.mktemp("runs")
    INSTANCE.save(folder / "instance.json")
    history, _ = simulate_history(INSTANCE, 3, 60)
    pyarrow.csv.write_csv(history, folder / "history.csv")
    run_script(
        "bound.py", "--kind", "decomposition", "--instance", folder / "instance.json", "--episodes", 2, "--horizon", HORIZON,
        "--factor-points", 9, "--coarse-points", 5, "--workers", 1, "--out", folder / "dec", check=True,
    )  # fmt: skip
    run_script(
        "backtest.py", "--history", folder / "history.csv", "--instance", folder / "instance.json", "--policy", "zero",
        "--policy", "base-stock", "--window", 20, "--out", folder / "bt", check=True,
    )  # fmt: skip
    assert (folder / "dec" / "lookahead" / "tables.json").is_file() and (folder / "bt" / "zero" / "summary.json").is_file()
    return folder


EVALUATE = ["--instance", "{runs}/instance.json", "--episodes", 2, "--horizon", HORIZON]
BACKTEST = ["--history", "{runs}/history.csv", "--instance", "{runs}/instance.json", "--window", 20]
CASES = {
    "backtest-over-the-bounds-equal-shares": (
        "backtest.py",
        [*BACKTEST, "--policy", "zero", "--out", "{runs}/dec/equal-shares", "--overwrite"],
        ["--out '{runs}/dec/equal-shares' lies inside '{runs}/dec', the folder of a decomposition bound (split.jsonl)"],
    ),
    "evaluate-into-the-tables-it-reads": (
        "evaluate.py",
        [*EVALUATE, "--policy", "decomposition-lookahead:{runs}/dec", "--out", "{runs}/dec/lookahead"],
        ["--out '{runs}/dec/lookahead' lies inside the --policy '{runs}/dec' that this run reads"],
    ),
    "backtest-into-the-tables-it-reads": (
        "backtest.py",
        [*BACKTEST, "--policy", "decomposition-lookahead:{runs}/dec", "--out", "{runs}/dec/lookahead"],
        ["--out '{runs}/dec/lookahead' lies inside the --policy decomposition-lookahead:{runs}/dec '{runs}/dec'"],
    ),
    "evaluate-over-a-backtests-policy-folder": (
        "evaluate.py",
        [*EVALUATE, "--policy", "zero", "--out", "{runs}/bt/zero", "--overwrite"],
        ["--out '{runs}/bt/zero' lies inside '{runs}/bt', the folder of a backtest (backtest.json)"],
    ),
    "report-into-an-evaluation-it-reads": (
        "report.py",
        ["{runs}/bt/zero", "{runs}/bt/base-stock", "--out", "{runs}/bt/zero/table.md"],
        ["--out '{runs}/bt/zero/table.md' lies inside the EVAL_DIR 1 '{runs}/bt/zero'"],
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_an_output_inside_an_input_or_another_run_changes_nothing(runs, case):
    """Each case is one `error:` line naming --out, the folder and what to do, exit status 2, and the bound's and
    the backtest's files are byte for byte what they were."""
    script, args, expected = CASES[case]
    before = digests(runs)
    result = run_script(script, *(str(a).format(runs=runs) for a in args))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: --out '"), result.stderr[-2000:]
    for needle in expected:
        assert needle.format(runs=runs) in lines[0]
    assert "give --out a path outside" in lines[0]
    assert digests(runs) == before


INDEX_FILES = {
    "summary.json": "an evaluation",
    "backtest.json": "a backtest",
    "split.jsonl": "a decomposition bound",
    "bounds.jsonl": "a perfect-information bound",
    "decisions.jsonl": "a rolling-MILP run",
    "checkpoint.pt": "a training run",
    "best.pt": "a training run",
    "training.json": "a training run",
}


@pytest.mark.parametrize("index", INDEX_FILES)
def test_an_output_anywhere_below_a_runs_record_is_refused(index, tmp_path):
    """A folder with a run's record is that run's folder: an output folder or file in it, or deeper, is refused
    naming the folder, the kind of run and the file; the folder itself passes (check_run_folder decides on it)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / index).write_text("{}\n")
    message = f"lies inside '{run}', the folder of {INDEX_FILES[index]} ({index})"
    with pytest.raises(InputError, match="^" + re.escape(f"--out '{run}/sub' {message}")):
        resolve_out(run / "sub")
    with pytest.raises(InputError, match="^" + re.escape(f"--markdown '{run}/a/b/table.md' {message}")):
        resolve_out(run / "a" / "b" / "table.md", "--markdown", is_file=True)
    assert resolve_out(run) == run
    assert sorted(tmp_path.rglob("*")) == sorted([run, run / index])  # the checks create nothing


def test_tables_and_subfolders_named_like_a_runs_entries_make_no_run(tmp_path):
    """A data folder holding an item table items.parquet, a cost table costs.parquet and evaluations named greedy/,
    lookahead/, equal-shares/ and tensorboard/ (names of run_results.records.RUNS entries) is no run's folder: an output
    folder or file beside them passes."""
    data = tmp_path / "data"
    for name in ("greedy", "lookahead", "equal-shares", "tensorboard"):
        (data / name).mkdir(parents=True)
        (data / name / "summary.json").write_text("{}\n")
    for name in ("items.parquet", "costs.parquet"):
        (data / name).write_bytes(b"PAR1")
    assert resolve_out(data / "zero") == data / "zero"
    assert resolve_out(data / "inst.json", is_file=True, suffix=".json") == data / "inst.json"


def test_an_output_inside_a_folder_the_run_reads_is_refused(tmp_path):
    """--out inside a folder the script reads (`folders`) is refused naming the flag and the folder; beside it, it
    passes. A path that the script reads as a file (`inputs`) is no folder to be inside: given as a directory, the
    script refuses it as such (tests/bad_inputs: items-is-a-directory)."""
    tables = tmp_path / "tables"
    tables.mkdir()
    with pytest.raises(InputError, match="^" + re.escape(f"--out '{tables}/x/y' lies inside the --policy '{tables}' that this run reads")):
        resolve_out(tables / "x" / "y", inputs={"--instance": tmp_path / "inst.json"}, folders={"--policy": tables})
    assert resolve_out(tmp_path / "x", folders={"--policy": tables}) == tmp_path / "x"
    assert resolve_out(tables / "inst.json", is_file=True, inputs={"--items": tables}) == tables / "inst.json"


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_file_named_as_a_runs_record_that_is_not_one_is_neither_read_as_a_run_nor_deleted(tmp_path, overwrite):
    """An --out holding the user's own summary.json (plain text) is refused, with --overwrite too, naming the file, and
    the file is left as it was; the control, a summary.json of this platform's format, is a run that --overwrite
    replaces."""
    INSTANCE.save(tmp_path / "instance.json")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "summary.json").write_text("my notes, not JSON\n")
    flags = ["--instance", tmp_path / "instance.json", "--policy", "zero", "--episodes", 2, "--horizon", 3]
    result = run_script("evaluate.py", *flags, "--out", tmp_path / "mine", *(["--overwrite"] if overwrite else []))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"error: --out '{tmp_path / 'mine'}' holds a summary.json that is not a record of this platform (not JSON with its "
        "field 'format' 'or-transformer-platform/evaluation'): a run never replaces or deletes a file it did not write, even "
        "with --overwrite; move the file away or give another --out"
    )
    assert (tmp_path / "mine" / "summary.json").read_text() == "my notes, not JSON\n"
    run_script("evaluate.py", *flags, "--out", tmp_path / "ours", check=True)
    run_script("evaluate.py", *flags, "--out", tmp_path / "ours", "--overwrite", check=True)


def test_an_output_folder_that_holds_a_run_in_a_folder_of_its_own_is_refused(tmp_path):
    """--out runs/ where runs/ev0 holds an evaluation: refused, naming the run inside, since runs/ev0 would lie inside
    the new run's folder and could not be written again; runs/ev1 beside it passes."""
    INSTANCE.save(tmp_path / "instance.json")
    flags = ["--instance", tmp_path / "instance.json", "--policy", "zero", "--episodes", 2, "--horizon", 3]
    run_script("evaluate.py", *flags, "--out", tmp_path / "runs" / "ev0", check=True)
    result = run_script("evaluate.py", *flags, "--out", tmp_path / "runs")
    assert result.returncode == 2 and result.stderr.strip() == (
        f"error: --out '{tmp_path / 'runs'}' holds an evaluation in '{tmp_path / 'runs' / 'ev0'}' (summary.json): a run's folder "
        f"holds that run alone, and '{tmp_path / 'runs' / 'ev0'}' would then lie inside it, never to be written again; give the run "
        "a folder of its own"
    )
    run_script("evaluate.py", *flags, "--out", tmp_path / "runs" / "ev1", check=True)
