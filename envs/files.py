"""A user's input files read, and output folders checked, with one clear error: a missing, unreadable, non-UTF-8 or
malformed file is one InputError naming what the file is ("instance file", "state file") and its path. Below
envs.cli (the scripts' boundary), envs.instance and envs.job_output, so that none of them imports another in a circle."""

from __future__ import annotations

import tempfile
from pathlib import Path

from envs import validate
from envs.errors import InputError


def input_file(path, what: str) -> Path:
    """`path` as an existing, readable regular file; otherwise an InputError naming `what` and the path."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{what} '{path}' does not exist")
    if path.is_dir():
        raise InputError(f"{what} '{path}' is a directory, expected a file")
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise InputError(f"{what} '{path}' cannot be read ({exc.strerror})") from None
    return path


def read_text(path, what: str) -> str:
    """The UTF-8 text of an input file, checked by `input_file`."""
    path = input_file(path, what)
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} '{path}' is not valid UTF-8 (byte {exc.start})") from None


def read_file(path, what: str):
    """Parse a JSON (.json, envs.validate.load_json) or YAML (other suffixes, envs.validate.load_yaml) input file; a
    missing, unreadable or malformed file is one InputError naming `what` ("state file", "config file") and the path."""
    text = read_text(path, what)
    if Path(path).suffix.lower() != ".json":
        return validate.load_yaml(text, what, path)
    return validate.load_json(text, what, path)


def output_dir(path, what: str = "--out") -> Path:
    """Check, before any work, that `path` can be the output directory: not an existing file, and
    writable (tested by creating and removing a temporary file). Creates nothing."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InputError(f"{what} '{path}' is an existing file, expected a directory")
    ancestor = path
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise InputError(f"{what} '{path}': '{ancestor}' is a file, so no directory can be made under it")
    try:
        with tempfile.TemporaryFile(dir=ancestor):
            pass
    except OSError as exc:
        raise InputError(f"{what} '{path}': cannot write in '{ancestor}' ({exc.strerror})") from None
    return path
