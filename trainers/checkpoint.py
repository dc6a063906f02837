"""Checkpoints: weights, optimiser and rollout state, config and instance, in one file that loads
with `torch.load(weights_only=True)` (tensors and primitives only; nothing is unpickled).

This module knows the file format, not the methods: `read_checkpoint` returns the stored config as a
dict. trainers.registry.load_checkpoint gives it its method's typed config."""

from __future__ import annotations

import os
import pickle
import pickletools
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch

from envs.instance import Instance
from plumbing.errors import InputError, first_line
from plumbing.files import atomic_write

FORMAT = "or-transformer-platform/checkpoint"
VERSION = 1


class CheckpointError(InputError):
    """A checkpoint file is missing, truncated, foreign or does not match what it is loaded into."""


LAST, BEST = "checkpoint.pt", "best.pt"
"""A run folder's checkpoint of its last update, and the network its validation kept (trainers.model_selection)."""


def checkpoint_file(path: str | os.PathLike) -> Path:
    """The checkpoint that `path` names: a file as it is; a run folder its best.pt, or its checkpoint.pt where it has
    no best.pt (a run that does not validate)."""
    path = Path(path)
    if not path.is_dir():
        return path
    for name in (BEST, LAST):
        if (path / name).is_file():
            return path / name
    raise CheckpointError(f"checkpoint '{path}' is a directory without {BEST} or {LAST}: expected a run folder or a checkpoint file")


def network_of(trainer_state: dict[str, Any]) -> dict[str, Any]:
    """Which network a checkpoint holds: {network: best, update, validation_cost, validation_se} for a best.pt, else
    {network: last, update}."""
    if trainer_state.get("network") == "best":
        score = trainer_state["validation"]
        return {"network": "best", "update": trainer_state["update"], "validation_cost": score["cost"], "validation_se": score["se"]}
    return {"network": "last", "update": trainer_state["update"]}


def save_checkpoint(
    path: str | os.PathLike,
    config,
    instance: Instance,
    trainer_state: dict[str, Any],
    status: str,
    reason: str | None = None,
    attempts: list[int] | None = None,
) -> None:
    """Write atomically (temporary file, then rename). `status` is the run's (running, completed, diverged,
    interrupted, failed) at the checkpoint's update; `reason` says why it diverged or failed; `attempts` the update each training
    attempt of the run started from (trainers.run_folder), [0] when not given."""
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "config": config.to_dict(),
        "instance": instance.to_dict(),
        "status": status,
        "reason": reason,
        "trainer": trainer_state,
        "attempts": list(attempts or [0]),
    }
    atomic_write(path, lambda tmp: torch.save(payload, tmp))


def pickled_global(path: Path) -> str | None:
    """The first Python object (module.name) that the pickle stream in `path` names by a GLOBAL opcode, or None (not a
    pickle stream of protocol 2 or later, which begins with the PROTO opcode, or one naming none that way).
    pickletools reads the opcodes without running any."""
    try:
        with path.open("rb") as stream:
            if stream.read(1) != pickle.PROTO:
                return None
            stream.seek(0)
            for opcode, argument, _ in pickletools.genops(stream):
                if opcode.name == "GLOBAL":
                    return str(argument).replace(" ", ".")
    except Exception:  # any malformed stream: pickletools raises ValueError, EOFError, UnicodeDecodeError, ...
        return None
    return None


def not_unpickled(path: Path, holds: str) -> CheckpointError:
    return CheckpointError(
        f"checkpoint '{path}' is truncated or not a checkpoint of this platform: it holds {holds}, "
        "and it will not be unpickled (unpickling can run any code a file names)"
    )


def read_checkpoint(path: str | os.PathLike, device: str | torch.device = "cpu") -> dict[str, Any]:
    """Load and validate the file (of a run folder: `checkpoint_file`'s); returns {config: dict (with a text 'method'),
    instance: Instance, status, reason, trainer, attempts} (attempts [0] in a checkpoint written before they were
    recorded)."""
    path = checkpoint_file(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint '{path}' does not exist")
    if not zipfile.is_zipfile(path):  # torch.load would read any other file as a pickle stream: KeyError, IndexError, ...
        named = pickled_global(path)
        if named is None:
            raise CheckpointError(
                f"checkpoint '{path}' is truncated or not a checkpoint of this platform (not a zip archive, which torch.save writes)"
            )
        raise not_unpickled(path, f"the Python object {named}")
    try:
        with warnings.catch_warnings():  # torch's remarks on a foreign file's pickle protocol
            warnings.simplefilter("ignore")
            payload = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as exc:  # torch's message advises weights_only=False, which would run the file's code
        named = re.search(r"GLOBAL (\S+)", str(exc))
        raise not_unpickled(path, f"the Python object {named.group(1)}" if named else "data other than tensors and plain values") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError) as exc:
        raise CheckpointError(f"checkpoint '{path}' is truncated or not a checkpoint of this platform ({first_line(exc)})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint '{path}': not a checkpoint of this platform (field 'format' should be '{FORMAT}')")
    if payload.get("version") != VERSION:
        raise CheckpointError(f"checkpoint '{path}': field 'version' is {payload.get('version')!r}, this code reads version {VERSION}")
    try:
        config = payload["config"]
        if not isinstance(config, dict) or not isinstance(config.get("method"), str):
            raise ValueError("field 'config' is not a config with a method")
        instance = Instance.from_dict(payload["instance"])
        trainer = payload["trainer"]
        trainer["model"]
        if not isinstance(trainer["update"], int) or trainer["update"] < 0:
            raise ValueError(f"field 'update' is {trainer['update']!r}")
        attempts = payload.get("attempts", [0])
        if not (isinstance(attempts, list) and attempts and all(isinstance(a, int) and 0 <= a <= trainer["update"] for a in attempts)):
            raise ValueError(f"field 'attempts' is {attempts!r}")
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint '{path}': malformed content ({exc})") from None
    return {
        "config": config,
        "instance": instance,
        "status": payload.get("status"),
        "reason": payload.get("reason"),
        "trainer": trainer,
        "attempts": attempts,
    }
