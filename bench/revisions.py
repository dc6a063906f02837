"""Figures of another git revision, measured now on this machine, for a benchmark's `--against REV`."""

import json
import os
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def records_at(revision: str, command: list[str], what: str, stderr_through: bool = False) -> list[dict]:
    """The JSON records (stdout lines that start with '{') of `command`, run in a temporary worktree of `revision`
    with that tree's packages first on PYTHONPATH (which Ray's workers inherit too). A relative script path in
    `command` is the tree's own script. Its stderr goes on to this process's with `stderr_through`; otherwise a
    failure quotes its end. `what` names the command in that error."""
    with tempfile.TemporaryDirectory() as folder:
        tree = Path(folder) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(tree), revision], cwd=ROOT, check=True)
        try:
            done = subprocess.run(
                command,
                cwd=tree,
                env={**os.environ, "PYTHONPATH": str(tree)},
                stdout=subprocess.PIPE,
                stderr=None if stderr_through else subprocess.PIPE,
                text=True,
            )
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=True)
    if done.returncode:
        said = "its output is above" if stderr_through else done.stderr.strip()[-500:]
        raise SystemExit(f"error: {what} at {revision} failed (status {done.returncode}): {said}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
