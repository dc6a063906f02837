"""The project's input tables (item tables, cost tables, histories): the formats their suffixes name, and a CSV or
Parquet file read into a pyarrow Table with one clear error for a missing, empty or malformed file or column."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

from plumbing.errors import InputError, first_line
from plumbing.files import input_file, read_text

TABLE_SUFFIXES = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}
"""The suffixes of the tables the project reads and writes (item tables, histories, cost tables) and their formats."""


def table_format(path, what: str, error: type[Exception] = InputError) -> str:
    """'csv' or 'parquet', the format `path`'s suffix names (TABLE_SUFFIXES); any other suffix is one `error`
    naming `what` ("history", "--out")."""
    suffix = Path(path).suffix.lower()
    if suffix not in TABLE_SUFFIXES:
        raise error(f"{what} '{path}': expected a .csv or .parquet (.pq) file, got '{suffix}'")
    return TABLE_SUFFIXES[suffix]


def read_table(path: str | os.PathLike, what: str, header: str, column_types: dict | None = None, error: type[Exception] = InputError):
    """(path, pyarrow Table) of a UTF-8 CSV (with a header line) or Parquet input file; one `error` (InputError or a
    kind of it) naming `what` and the path for a missing, unreadable, empty or malformed file. `column_types` fixes CSV column types by name
    (e.g. item names as text, so that '007' stays '007')."""
    import pyarrow as pa
    import pyarrow.csv
    import pyarrow.parquet

    path = input_file(path, what)
    csv = table_format(path, what, error) == "csv"
    try:
        if csv:
            text = read_text(path, what)
            if not text.strip():
                raise error(f"{what} '{path}' is empty; expected {header}")
            options = pyarrow.csv.ConvertOptions(column_types=column_types or {})
            # one thread (here and for Parquet): Arrow's CPU thread pool, once started, can abort the interpreter's exit
            # ("terminate called without an active exception", SIGABRT: 2 of 6 runs of instance.py --items here)
            reading = pyarrow.csv.ReadOptions(use_threads=False)
            table = pyarrow.csv.read_csv(io.BytesIO(text.encode()), read_options=reading, convert_options=options)
        else:
            table = pyarrow.parquet.read_table(path, use_threads=False)
    except pa.ArrowException as exc:
        raise error(f"{what} '{path}' is not a readable {'CSV' if csv else 'Parquet'} file ({first_line(exc)})") from None
    return path, table


def number_column(table, name: str, path, error: type[Exception] = InputError) -> list:
    """The values of the numeric column `name` of an item table read from `path`; missing values or text are one
    `error` naming the column."""
    import pyarrow as pa

    column = table.column(name)
    if column.null_count:
        raise error(f"instance field '{name}': {column.null_count} missing values in '{path}'")
    if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
        raise error(f"item table '{path}' column '{name}': expected numbers, got {column.type} values{_first_text(column.to_pylist())}")
    return column.to_pylist()


def _first_text(values: list) -> str:
    """' (first: "abc" in row 3)' for the first value of a text column that is not a number; '' if none."""
    for row, value in enumerate(values, start=1):
        try:
            float(value)
        except (TypeError, ValueError):
            return f" (first: {json.dumps(value)} in data row {row})"
    return ""
