"""Checkpoints of a layer-wise training run: one file that resumes it bit for bit.

Rank 0 writes `checkpoint.pt` in the run folder, atomically (a crash leaves the previous one):
the engine's training state (the plain module's full state_dict, and the optimizer's state as
the engine keeps it: for the layer-wise engine SGD's momentum as full tensors keyed like the
state_dict), the step, the torch RNG state (dropout masks come from the global generator, and
on CUDA from the device's) and the records of the steps so far.
Shards live on many ranks, so saving is collective: every rank calls `save_checkpoint` and it
returns on all of them only when the file is in place, so a rank that dies right after a
checkpoint cannot lose it.

Resuming loads the same file on every rank (the run folder is shared, or on one machine) and
keeps each rank's part; the run then continues at step + 1 with the batches, masks and
momentum an uninterrupted run would have.
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch
from pydantic import TypeAdapter, ValidationError

from strategies.errors import LayerwiseError, shown
from strategies.files import atomic_path, first_error
from strategies.run import StepRecord
from strategies.runtime.engine_base import MODEL_STATE_KEY, Engine

CHECKPOINT_NAME = "checkpoint.pt"
SCHEMA_VERSION = 2


def save_checkpoint(path: Path, engine: Engine, step: int,
                    records: list[StepRecord]) -> dict[str, torch.Tensor] | None:
    """Write the checkpoint of `step` (collective); returns the full state_dict on rank 0."""
    state = engine.training_state()
    if state is not None:
        payload = {
            "schema_version": SCHEMA_VERSION,
            "step": step,
            "engine": state,
            "rng": torch.get_rng_state(),
            "cuda_rng": (torch.cuda.get_rng_state(engine.device)
                         if engine.device.type == "cuda" else None),
            "steps": [record.model_dump() for record in records],
        }
        with atomic_path(path) as temporary:
            torch.save(payload, temporary)
    engine.barrier()
    return state[MODEL_STATE_KEY] if state is not None else None


def trained_weights(engine: Engine) -> dict[str, torch.Tensor] | None:
    """The plain module's full state_dict on rank 0 (collective), for a run that writes no
    checkpoint: gathering it is the one part of saving such a run still needs."""
    state = engine.training_state()
    engine.barrier()
    return state[MODEL_STATE_KEY] if state is not None else None


def load_checkpoint(path: Path, engine: Engine) -> tuple[int, list[StepRecord]]:
    """Restore weights, optimizer state and RNG from `path`; returns (step, records)."""
    payload = _read(path)
    engine.load_training_state(payload["engine"])
    torch.set_rng_state(payload["rng"])
    if engine.device.type == "cuda" and payload.get("cuda_rng") is not None:
        torch.cuda.set_rng_state(payload["cuda_rng"], engine.device)
    return int(payload["step"]), [StepRecord(**record) for record in payload["steps"]]


def checkpoint_step(path: Path) -> int | None:
    """The step a checkpoint file holds (None if there is none), after checking the whole file
    can be read as a checkpoint: the launcher calls this before any worker starts, so that a
    broken file is one line, not a failure in every rank. The tensors are mapped, not read."""
    if not path.exists():
        return None
    return int(_read(path, mmap=True)["step"])


_STEP_RECORDS = TypeAdapter(list[StepRecord])
# What a checkpoint's payload holds, key by key (see `save_checkpoint`).
_PAYLOAD_TYPES: dict[str, type | tuple[type, ...]] = {
    "schema_version": int, "step": int, "engine": dict, "rng": torch.Tensor,
    "cuda_rng": (torch.Tensor, type(None)), "steps": list,
}


def _read(path: Path, mmap: bool = False) -> dict[str, Any]:
    fix = "restore it from a copy, or start a new run"
    if not path.is_file():
        raise LayerwiseError(f"checkpoint {path} is not a file; {fix}")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; its index is last
        raise LayerwiseError(f"checkpoint {path} is not a torch checkpoint (empty, truncated "
                             f"or overwritten); {fix}")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError:
        raise LayerwiseError(f"checkpoint {path} holds objects other than tensors and plain "
                             f"values, which layerwise refuses to load; {fix}") from None
    except (RuntimeError, OSError, EOFError, ValueError) as problem:
        first = (str(problem).strip().splitlines() or [""])[0]
        raise LayerwiseError(f"checkpoint {path} cannot be read ({type(problem).__name__}: "
                             f"{shown(first, 100)}); {fix}") from None
    if not isinstance(payload, dict):
        raise LayerwiseError(f"checkpoint {path} holds a {type(payload).__name__}, not a "
                             f"layerwise checkpoint; {fix}")
    if payload.get("schema_version") != SCHEMA_VERSION:
        raise LayerwiseError(f"checkpoint {path} has schema_version "
                             f"{shown(payload.get('schema_version'))}, this layerwise reads "
                             f"{SCHEMA_VERSION}; start a new run")
    for key, kind in _PAYLOAD_TYPES.items():
        if not isinstance(payload.get(key), kind) or isinstance(payload.get(key), bool):
            raise LayerwiseError(f"checkpoint {path}: '{key}' is missing or malformed; {fix}")
    if payload["step"] < 1:
        raise LayerwiseError(f"checkpoint {path}: step {payload['step']} is not a step; {fix}")
    try:
        _STEP_RECORDS.validate_python(payload["steps"])
    except ValidationError as problem:
        raise LayerwiseError(f"checkpoint {path}: steps.{first_error(problem)}; {fix}") from None
    return payload
