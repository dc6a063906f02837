"""Bad input through the real scripts, one row of tests/bad_inputs/*.yaml each: the script exits with the
row's status (2 by default), prints exactly one `error:` line that contains every expected substring,
never a traceback, and leaves nothing in its output folder.

A row: id, script (in platform/), args, optional files (text written under {tmp}) and binary (hex bytes),
expect (substrings of the error line), optional exit. Placeholders: {tmp} (an empty folder per row),
{out} (= {tmp}/out), {instance} / {instance4} (paper instances, n = 2 / 4) and {<method>_checkpoint}
(a tiny trained run of that method on {instance}, made once per session when a row needs it)."""

import re
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, run_script

TABLES = sorted((Path(__file__).parent / "bad_inputs").glob("*.yaml"))
ROWS = [row for table in TABLES for row in yaml.safe_load(table.read_text())]
CHECKPOINT_METHODS = {"pathwise": "or-transformer", "hpo": "hpo", "ppo": "ppo", "transformer_ppo": "transformer-ppo"}


def test_the_table_has_at_least_40_distinct_rows():
    ids = [row["id"] for row in ROWS]
    assert len(ids) >= 40 and len(set(ids)) == len(ids)
    for row in ROWS:
        assert set(row) <= {"id", "script", "args", "files", "binary", "expect", "exit"}, row["id"]
        assert (ROOT / "platform" / row["script"]).is_file() and row["expect"], row["id"]


@pytest.fixture(scope="session")
def shared_inputs(tmp_path_factory):
    """Instances at once; checkpoints on first use (training one costs seconds)."""
    folder = tmp_path_factory.mktemp("bad-inputs")
    for key, n in (("instance", 2), ("instance4", 4)):
        run_script("instance.py", "--n", n, "--out", folder / f"{key}.json", check=True)
    values = {"instance": str(folder / "instance.json"), "instance4": str(folder / "instance4.json")}

    def checkpoint(key: str) -> str:
        if key not in values:
            method = CHECKPOINT_METHODS[key.removesuffix("_checkpoint")]
            run = folder / method
            run_script("train.py", "--method", method, "--instance", values["instance"], "--config", ROOT / "tune_configs" / "quick.yaml",
                       "--updates", 2, "--batch", 4, "--episodes", 2, "--horizon", 3, "--out", run, check=True)
            values[key] = str(run / "checkpoint.pt")
        return values[key]

    return values, checkpoint


def fill(text: str, values: dict, checkpoint) -> str:
    def one(match):
        key = match.group(1)
        return checkpoint(key) if key.endswith("_checkpoint") else values[key]

    return re.sub(r"\{(\w+)\}", one, text)


@pytest.mark.parametrize("row", ROWS, ids=[row["id"] for row in ROWS])
def test_bad_input_gives_one_clear_error(row, tmp_path, shared_inputs):
    common, checkpoint = shared_inputs
    values = {**common, "tmp": str(tmp_path), "out": str(tmp_path / "out")}
    for name, text in row.get("files", {}).items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    for name, hexbytes in row.get("binary", {}).items():
        (tmp_path / name).write_bytes(bytes.fromhex(hexbytes))
    result = run_script(row["script"], *(fill(str(a), values, checkpoint) for a in row["args"]))
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:") or ": error:" in line]
    assert len(errors) == 1, result.stderr[-3000:]
    for needle in row["expect"]:
        assert needle in errors[0], f"{needle!r} not in {errors[0]!r}"
    assert result.returncode == row.get("exit", 2), result.stderr[-3000:]
    out = tmp_path / "out"
    assert not out.exists() or not [p for p in out.rglob("*") if p.is_file()], sorted(map(str, out.rglob("*")))

