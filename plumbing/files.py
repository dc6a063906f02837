"""A user's input files read, and output folders checked, with one clear error: a missing, unreadable, non-UTF-8 or
malformed file (Parquet included, `read_parquet`) is one InputError naming what the file is ("instance file", "state
file") and its path; and every file the platform writes written atomically (`atomic_write`)."""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from plumbing import validate
from plumbing.errors import InputError, first_line


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
    """Parse a JSON (.json, plumbing.validate.load_json) or YAML (other suffixes, plumbing.validate.load_yaml) input file; a
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


TEMPORARY = re.compile(r"\.(.+)\.tmp\d*")
"""The name `atomic_write` gives the temporary file of NAME: .NAME.tmpPID."""


def written_by_atomic_write(name: str) -> str | None:
    """The file whose atomic write (killed before its rename) left the temporary file `name`, else None."""
    match = TEMPORARY.fullmatch(name)
    return match.group(1) if match else None


def atomic_write(path: str | os.PathLike, write) -> None:
    """Call `write(tmp)` on a temporary file beside `path`, then rename it over `path`, so no reader
    ever sees half a file (every results, instance and checkpoint file is written this way)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text))


def read_parquet(path: str | os.PathLike, unreadable: Callable[[str], Exception], **options) -> pa.Table:
    """pyarrow's table of the Parquet file `path` (`options` as pyarrow.parquet.read_table takes them); a file Arrow
    cannot read raises `unreadable(the first line of Arrow's error)` instead, one line naming the file."""
    try:
        return pq.read_table(path, **options)
    except (pa.ArrowException, OSError) as exc:
        raise unreadable(first_line(exc)) from None


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of the file at `path` (hex), read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
