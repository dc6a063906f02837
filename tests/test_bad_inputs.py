"""Bad input through the real scripts, one row of tests/bad_inputs/*.yaml each: the script exits with the
row's status (2 by default), prints exactly one line with `error:`, at its start (a bad flag too: no usage block),
that contains every expected substring,
never a traceback, and leaves nothing in its output folder.

A row: id, script (in platform/), args, optional files (text written under {tmp}) and binary (hex bytes),
expect (substrings of the error line), optional exit. Placeholders: {tmp} (an empty folder per row),
{out} (= {tmp}/out), {instance} / {instance4} (paper instances, n = 2 / 4) and {<method>_checkpoint}
(the session's tiny trained run of that method on {instance}: conftest.trained)."""

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from conftest import INSTANCE, ROOT, run_script

from envs.instance import paper_instance

TABLES = sorted((Path(__file__).parent / "bad_inputs").glob("*.yaml"))
ROWS = [row for table in TABLES for row in yaml.safe_load(table.read_text())]
CHECKPOINT_METHODS = {"pathwise": "or-transformer", "hpo": "hpo", "ppo": "ppo", "transformer_ppo": "transformer-ppo"}


def test_the_table_has_at_least_40_distinct_rows():
    ids = [row["id"] for row in ROWS]
    assert len(ids) >= 40 and len(set(ids)) == len(ids)
    for row in ROWS:
        assert set(row) <= {"id", "script", "args", "files", "binary", "expect", "exit"}, row["id"]
        assert (ROOT / "platform" / row["script"]).is_file() and row["expect"], row["id"]


def fill(text: str, values: dict) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: values[m.group(1)], text)


def run_row(row, folder: Path, common: dict):
    """Write the row's files into its own folder and run its script."""
    values = {**common, "tmp": str(folder), "out": str(folder / "out")}
    for name, text in row.get("files", {}).items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    for name, hexbytes in row.get("binary", {}).items():
        (folder / name).write_bytes(bytes.fromhex(hexbytes))
    return run_script(row["script"], *(fill(str(a), values) for a in row["args"]))


@pytest.fixture(scope="session")
def outcomes(tmp_path_factory, trained):
    """Every row's (folder, result): the shared inputs first, then the rows two at a time, each a process
    forked from conftest's script server."""
    folder = tmp_path_factory.mktemp("bad-inputs")
    INSTANCE.save(folder / "instance.json")  # paper_instance(2, 0): the instance of the trained runs
    paper_instance(4, 0).save(folder / "instance4.json")
    common = {"instance": str(folder / "instance.json"), "instance4": str(folder / "instance4.json")}
    common |= {f"{key}_checkpoint": str(trained[method].checkpoint) for key, method in CHECKPOINT_METHODS.items()}
    folders = {row["id"]: folder / "rows" / row["id"] for row in ROWS}
    for path in folders.values():
        path.mkdir(parents=True)
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(zip(folders, pool.map(lambda row: run_row(row, folders[row["id"]], common), ROWS)))
    return {key: (folders[key], results[key]) for key in folders}


@pytest.mark.parametrize("row", ROWS, ids=[row["id"] for row in ROWS])
def test_bad_input_gives_one_clear_error(row, outcomes):
    folder, result = outcomes[row["id"]]
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output[-3000:]
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith("error: "), result.stderr[-3000:]
    assert not any(line.startswith("usage:") for line in result.stderr.splitlines()), result.stderr[-3000:]
    for needle in row["expect"]:
        assert needle in errors[0], f"{needle!r} not in {errors[0]!r}"
    assert result.returncode == row.get("exit", 2), result.stderr[-3000:]
    out = folder / "out"
    assert not out.exists() or not [p for p in out.rglob("*") if p.is_file()], sorted(map(str, out.rglob("*")))
