"""Where a script's results land: `out_argument` refuses a URI as every --out is parsed, before any path
handling (a `Path` would collapse `s3://b/x` into `s3:/b/x`); `resolve_out` checks it before any work starts
(docs/cluster.md).

Results are written through the file system (atomic renames, run_results/records.py), so --out is a path, never a
URI. Under `ray job submit` the driver runs in Ray's temporary copy of --working-dir (inside the Ray session
folder, runtime_resources/working_dir_files/...), which Ray deletes and the user never looks in: a job's --out
must be absolute and outside that copy. Nothing here imports Ray: the scripts check --out before they start it.

An output never lies inside what a run reads or another run wrote (`apart_from_inputs`, `outside_runs`): a folder
the script reads (a policy's tables, a checkpoint's run folder) would change under the run that reads it, and a file
or folder inside another run's folder (a bound's equal-shares/, a backtest's policy folder) would change that run
behind its own record (summary.json, backtest.json, split.jsonl), which would go on vouching for it. A run's own
folder is replaced whole with --overwrite (run_results.records.check_run_folder, clear_run), never a part of it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

from plumbing.errors import InputError
from plumbing.files import output_dir

# Set by Ray's job supervisor for the driver of a submitted job, and for nothing else (Ray 2.60:
# ray/dashboard/modules/job/job_supervisor.py, _get_driver_env_vars; RAY_JOB_ID is removed from the driver's
# environment as an internal flag). Its value is the job's config: {"runtime_env": ..., "metadata": ...}.
JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
SHARED = (
    "give an absolute path that you can read after the job ends, on a multi-node cluster one on a file system "
    "that every node mounts (e.g. --out /mnt/shared/runs/x; docs/cluster.md)"
)


def uri_refusal(text: str) -> str | None:
    """Why `text` cannot be an output path, when it is a URI (scheme://...); else None."""
    if not URI.match(text):
        return None
    return (
        f"'{text}' is a URI; the results are written through the file system, so give a path (on a cluster, on a file "
        "system that every node mounts, e.g. an NFS/EFS volume or a Kubernetes ReadWriteMany volume) and copy the "
        "results to object storage afterwards"
    )


def out_argument(text: str) -> str:
    """The argparse type of every output flag (--out, --markdown): the text as given, refused when it is empty or names the
    current folder itself (a run's files would mix with whatever is there), or a URI."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"expected a file or folder path, got {text!r} (an empty path would write into the current folder)"
        )
    if Path(text).resolve() == Path.cwd().resolve():
        raise argparse.ArgumentTypeError(
            f"{text!r} is the current folder: a run's files would mix with what it holds; name a folder for them, like runs/NAME"
        )
    if (refusal := uri_refusal(text)) is not None:
        raise argparse.ArgumentTypeError(refusal)
    return text


def job_runtime_env() -> dict | None:
    """The runtime environment of the Ray job this process is the driver of, or None outside a submitted job."""
    config = os.environ.get(JOB_CONFIG_ENV)
    if config is None:
        return None
    return json.loads(config).get("runtime_env") or {}


def apart_from_inputs(out: Path, inputs: dict[str, object], folders: dict[str, object], what: str, *, is_file: bool) -> None:
    """Raises InputError for an output that lies inside one of the `folders` the script reads (flag -> path, None where not given), is one
    of the paths it reads or writes under another flag (`inputs`, alike) or, for an output folder, holds one: writing would change or
    destroy that path, with --overwrite too. A checkpoint's folder is a run's, refused by `outside_runs`; a path read as a file is no
    folder to lie inside."""
    target = out.resolve()
    for flag, given in folders.items():
        if given is not None and Path(given).resolve() in target.parents:
            raise InputError(
                f"{what} '{out}' lies inside the {flag} '{given}' that this run reads: writing there would change what it reads "
                f"(a script never writes into its own input, even with --overwrite); give {what} a path outside '{given}'"
            )
    for flag, given in inputs.items():
        if given is None:
            continue
        source = Path(given).resolve()
        if source == target or (not is_file and source.is_relative_to(target)):
            where = "is" if source == target else "contains"
            raise InputError(
                f"{what} '{out}' {where} the {flag} '{given}' of this run, which writing {what} would destroy (a script never "
                f"writes over its own input, even with --overwrite): give another {what}"
            )


def outside_runs(out: Path, what: str) -> None:
    """Refuse an output that lies inside another run's folder (a folder above it that run_results.records.run_record recognises): that
    run's record would go on vouching for files that are no longer its own, or stand beside foreign ones."""
    from run_results.records import run_record  # torch and scipy: loaded when an output is checked, not when cli.scripts is imported

    for folder in out.resolve().parents:
        if (held := run_record(folder)) is not None:
            kind, entry = held
            raise InputError(
                f"{what} '{out}' lies inside '{folder}', the folder of {kind} ({entry}): writing there would change that run "
                f"behind its {entry}; give {what} a path outside it (a run is replaced whole, by giving its own folder with --overwrite)"
            )


def resolve_out(
    path, what: str = "--out", *, is_file: bool = False, suffix: str | None = None, overwrite: bool = False, inputs=None, folders=None
) -> Path:
    """Returns `path` checked, before any work, as the script's output folder (or, with is_file, output file); creates nothing. Raises
    InputError for a URI; under `ray job submit`, a relative path or one in the job's copy of its working directory; an output inside
    the `folders` read, overlapping the `inputs` (`apart_from_inputs`) or inside another run's folder (`outside_runs`); for a file, a
    directory, a name without `suffix`, an existing file without `overwrite`; a place not writable (plumbing.files.output_dir)."""
    text = str(path)
    if (refusal := uri_refusal(text)) is not None:
        raise InputError(f"{what} {refusal}")
    runtime_env = job_runtime_env()
    if runtime_env is not None:
        cwd = Path.cwd()
        copy = runtime_env.get("working_dir")
        if not Path(text).is_absolute():
            where = "Ray's temporary copy of --working-dir, which Ray deletes" if copy else "on the node that runs the driver"
            raise InputError(
                f"{what} '{text}' is relative, and this script runs as a Ray job: it would resolve against the "
                f"job's working directory '{cwd}' ({where}), not where you ran `ray job submit`; {SHARED}"
            )
        if copy and Path(os.path.abspath(text)).is_relative_to(cwd):
            raise InputError(
                f"{what} '{text}' lies in Ray's temporary copy of the job's --working-dir '{cwd}', which Ray deletes; {SHARED}"
            )
    out = Path(text)
    apart_from_inputs(out, inputs or {}, folders or {}, what, is_file=is_file)
    outside_runs(out, what)
    if not is_file:
        output_dir(out, what)
        return out
    if out.is_dir():
        raise InputError(f"{what} '{text}' is a directory, expected the path of a file to write")
    if suffix is not None and out.suffix.lower() != suffix:
        raise InputError(f"{what} '{text}': expected a file name ending in {suffix}, got '{out.name}'")
    if out.exists() and not overwrite:
        raise InputError(f"{what} '{text}' exists: give --overwrite to replace it, or another {what}")
    output_dir(out.parent, f"{what}'s folder")
    return out
