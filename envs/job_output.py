"""Where a script's results land: `out_argument` refuses a URI as every --out is parsed, before any path
handling (a `Path` would collapse `s3://b/x` into `s3:/b/x`); `resolve_out` checks it before any work starts
(docs/cluster.md).

Results are written through the file system (atomic renames, envs/results.py), so --out is a path, never a
URI. Under `ray job submit` the driver runs in Ray's temporary copy of --working-dir (inside the Ray session
folder, runtime_resources/working_dir_files/...), which Ray deletes and the user never looks in: a job's --out
must be absolute and outside that copy. Nothing here imports Ray: the scripts check --out before they start it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

from envs.errors import InputError
from envs.files import output_dir

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
    """The argparse type of every output flag (--out, --markdown): the text as given, refused when it is a URI."""
    if (refusal := uri_refusal(text)) is not None:
        raise argparse.ArgumentTypeError(refusal)
    return text


def job_runtime_env() -> dict | None:
    """The runtime environment of the Ray job this process is the driver of, or None outside a submitted job."""
    config = os.environ.get(JOB_CONFIG_ENV)
    if config is None:
        return None
    return json.loads(config).get("runtime_env") or {}


def apart_from_inputs(out: Path, inputs: dict[str, object], what: str, *, is_file: bool) -> None:
    """Refuse an output that is one of the paths the script reads or writes under another flag (`inputs`: flag -> path,
    None where not given), or, for an output folder, one that contains one: writing it would destroy that path, with
    --overwrite too."""
    target = out.resolve()
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


def resolve_out(
    path, what: str = "--out", *, is_file: bool = False, suffix: str | None = None, overwrite: bool = False, inputs=None
) -> Path:
    """`path` as the script's output directory (or, with is_file, output file), checked before any work: not a
    URI; under `ray job submit` absolute and outside the job's copy of its working directory; not one of the
    script's `inputs` nor, for a directory, holding one (`apart_from_inputs`); a file not a directory, named with
    `suffix` when given, and not an existing file unless `overwrite`; then writable (envs.files.output_dir, of the
    file's folder with is_file). Creates nothing."""
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
    apart_from_inputs(out, inputs or {}, what, is_file=is_file)
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
