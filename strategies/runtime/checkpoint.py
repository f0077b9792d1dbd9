"""Checkpoints of a layer-wise training run: one file that resumes it bit for bit.

Rank 0 writes `checkpoint.pt` in the run folder, atomically (a crash leaves the previous one):
the engine's training state (the plain module's full state_dict, and the optimizer's state as
the engine keeps it: for the layer-wise engine SGD's momentum as full tensors keyed like the
state_dict), the step, the torch RNG state (dropout masks come from the global generator, and
on CUDA from the device's) and the records of the steps so far.
Shards live on many ranks, so saving is collective: every rank calls `save_checkpoint` and it
returns on all of them only when the file is in place, so a rank that dies right after a
checkpoint cannot lose it.

A flipped bit in a tensor still unpickles, and training would go on from corrupt weights
without a word; so each checkpoint holds the sha256 of its content, and the one before it is
kept as `checkpoint.pt.prev`. A resumed run continues from the newest checkpoint that passes
its check (`resume_point`) and says when that is the previous one.

Resuming loads the same file on every rank (the run folder is shared, or on one machine) and
keeps each rank's part; the run then continues at step + 1 with the batches, masks and
momentum an uninterrupted run would have.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch
from pydantic import TypeAdapter, ValidationError

from layerwise.strategies.errors import LayerwiseError, shown
from layerwise.strategies.files.atomic import atomic_path, first_error, save_tensors
from layerwise.strategies.runtime.engine_protocol import MODEL_STATE_KEY, Engine
from layerwise.strategies.training_run import StepRecord

PREVIOUS_SUFFIX = ".prev"  # checkpoint.pt.prev: the one before, to fall back to
CORRUPT_SUFFIX = ".corrupt"  # a newest one that failed its check, kept for a look
SCHEMA_VERSION = 3  # 3: the sha256 of the content
_DIGEST_KEY = "sha256"
_START_AGAIN = "train the run again with a new --out"


class CorruptCheckpoint(LayerwiseError):
    """A checkpoint file that cannot be read, or whose content is not what was written."""


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """The checkpoint a resumed run continues from, its step, and, when the newest one failed
    its check, the line that says so."""

    path: Path
    step: int
    note: str | None = None
    # the checkpoint's model weights, name -> (shape, dtype): what the run's model must match
    weights: dict[str, tuple[tuple[int, ...], torch.dtype]] | None = None

    def check_weights(self, expected: dict[str, tuple[tuple[int, ...], torch.dtype]],
                      model: str) -> None:
        """LayerwiseError unless the checkpoint holds weights of exactly the shapes and dtypes
        of `expected` (the run's module, as it trains): a checkpoint copied from another run
        would otherwise fail only once every worker has started."""
        if self.weights is None or self.weights == expected:
            return
        missing = sorted(expected.keys() - self.weights.keys())
        extra = sorted(self.weights.keys() - expected.keys())
        differing = sorted(name for name in expected.keys() & self.weights.keys()
                           if expected[name] != self.weights[name])
        if missing or extra:
            what = (f"lacks '{missing[0]}'" if missing else f"has '{extra[0]}', which {model} "
                    "does not")
        else:
            name = differing[0]
            (shape, dtype), (found_shape, found_dtype) = expected[name], self.weights[name]
            what = (f"holds '{name}' as {_described(found_shape, found_dtype)}, where {model} "
                    f"has {_described(shape, dtype)}")
        raise LayerwiseError(f"checkpoint {self.path} is not of this run's {model}: it {what}; "
                             f"resume the run it came from, or {_START_AGAIN}")


def _described(shape: tuple[int, ...], dtype: torch.dtype) -> str:
    return f"{'x'.join(map(str, shape)) or 'a scalar'} {str(dtype).removeprefix('torch.')}"


def save_checkpoint(path: Path, engine: Engine, step: int,
                    records: list[StepRecord]) -> dict[str, torch.Tensor] | None:
    """Write the checkpoint of `step` (collective), keeping the one before it as
    `path`.prev; returns the full state_dict on rank 0."""
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
            save_tensors(sealed(payload), temporary, path)
            if path.is_file():  # a crash between the two renames leaves .prev: still resumable
                os.replace(path, _previous(path))
    engine.barrier()
    return state[MODEL_STATE_KEY] if state is not None else None


def trained_weights(engine: Engine) -> dict[str, torch.Tensor] | None:
    """The plain module's full state_dict on rank 0 (collective), for a run that writes no
    checkpoint: gathering it is the one part of saving such a run still needs."""
    state = engine.training_state()
    engine.barrier()
    return state[MODEL_STATE_KEY] if state is not None else None


def load_checkpoint(path: Path, engine: Engine) -> tuple[int, list[StepRecord]]:
    """Restore weights, optimizer state and RNG from `path`, after checking its sha256;
    returns (step, records)."""
    payload = read_checkpoint(path, mmap=False)
    engine.load_training_state(payload["engine"])
    torch.set_rng_state(payload["rng"])
    if engine.device.type == "cuda" and payload.get("cuda_rng") is not None:
        torch.cuda.set_rng_state(payload["cuda_rng"], engine.device)
    return int(payload["step"]), [StepRecord(**record) for record in payload["steps"]]


def resume_point(path: Path) -> ResumePoint | None:
    """The newest checkpoint at `path` or `path`.prev that passes its check (None when there
    is neither file). A newest one that fails is renamed `path`.corrupt, so that the resumed
    run's next save keeps the sound previous one as `.prev`. CorruptCheckpoint when every one
    there fails."""
    previous = _previous(path)
    if not path.is_file():
        if not previous.is_file():
            return None
        return dataclasses.replace(  # a save stopped mid-rotation
            _verified(previous), note=f"{path.name} is missing; resuming from {previous.name}")
    try:
        return _verified(path)
    except CorruptCheckpoint as newest:
        if not previous.is_file():
            raise CorruptCheckpoint(f"{newest}, and there is no {previous.name} to fall back "
                                    f"to; {_START_AGAIN}") from None
        try:
            point = _verified(previous)
        except CorruptCheckpoint as older:
            raise CorruptCheckpoint(f"{newest}; {older}; {_START_AGAIN}") from None
        corrupt = path.with_name(path.name + CORRUPT_SUFFIX)
        os.replace(path, corrupt)
        return dataclasses.replace(point, note=f"{newest}; kept as {corrupt.name}, resuming "
                                               f"from {previous.name} (step {point.step})")


def _previous(path: Path) -> Path:
    return path.with_name(path.name + PREVIOUS_SUFFIX)


def read_checkpoint(path: Path, mmap: bool = True) -> dict[str, Any]:
    """The checkpoint's content after checking it against its sha256; CorruptCheckpoint if it
    cannot be read or does not match. `mmap` reads tensors as their pages are touched."""
    payload = _read(path, mmap=mmap)
    stored = payload.pop(_DIGEST_KEY, None)
    if stored != _digest(payload):
        raise CorruptCheckpoint(f"checkpoint {path} fails its sha256 check (its content changed "
                                "after it was written: a damaged disk or copy)")
    return payload


def _verified(path: Path) -> ResumePoint:
    payload = read_checkpoint(path)
    state = payload["engine"].get(MODEL_STATE_KEY)
    weights = ({name: (tuple(tensor.shape), tensor.dtype) for name, tensor in state.items()
                if isinstance(tensor, torch.Tensor)} if isinstance(state, dict) else None)
    return ResumePoint(path, int(payload["step"]), weights=weights)


_STEP_RECORDS = TypeAdapter(list[StepRecord])
# What a checkpoint's payload holds, key by key (see `save_checkpoint`).
_PAYLOAD_TYPES: dict[str, type | tuple[type, ...]] = {
    "schema_version": int, "step": int, "engine": dict, "rng": torch.Tensor,
    "cuda_rng": (torch.Tensor, type(None)), "steps": list,
}


def _read(path: Path, mmap: bool = False) -> dict[str, Any]:
    if not path.is_file():
        raise CorruptCheckpoint(f"checkpoint {path} is not a file")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; its index is last
        raise CorruptCheckpoint(f"checkpoint {path} is not a torch checkpoint (empty, "
                                "truncated or overwritten)")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError:
        raise CorruptCheckpoint(f"checkpoint {path} holds objects other than tensors and plain "
                                "values, which layerwise refuses to load") from None
    except (RuntimeError, OSError, EOFError, ValueError) as problem:
        first = (str(problem).strip().splitlines() or [""])[0]
        raise CorruptCheckpoint(f"checkpoint {path} cannot be read ({type(problem).__name__}: "
                                f"{shown(first, 100)})") from None
    if not isinstance(payload, dict):
        raise CorruptCheckpoint(f"checkpoint {path} holds a {type(payload).__name__}, not a "
                                "layerwise checkpoint")
    if payload.get("schema_version") != SCHEMA_VERSION:
        raise LayerwiseError(f"checkpoint {path} has schema_version "
                             f"{shown(payload.get('schema_version'))}, this layerwise reads "
                             f"{SCHEMA_VERSION}; start a new run")
    for key, kind in _PAYLOAD_TYPES.items():
        if not isinstance(payload.get(key), kind) or isinstance(payload.get(key), bool):
            raise CorruptCheckpoint(f"checkpoint {path}: '{key}' is missing or malformed")
    if payload["step"] < 1:
        raise CorruptCheckpoint(f"checkpoint {path}: step {payload['step']} is not a step")
    try:
        _STEP_RECORDS.validate_python(payload["steps"])
    except ValidationError as problem:
        raise CorruptCheckpoint(f"checkpoint {path}: steps.{first_error(problem)}") from None
    return payload


def sealed(payload: dict[str, Any]) -> dict[str, Any]:
    """`payload` with the sha256 of its content, as a checkpoint file holds it."""
    return {**payload, _DIGEST_KEY: _digest(payload)}


def _digest(payload: Any) -> str:
    """sha256 over every value in `payload`: tensors by dtype, shape and bytes, containers in
    order, anything else by its repr (exact for floats)."""
    hasher = hashlib.sha256()
    _feed(hasher, payload)
    return hasher.hexdigest()


def _feed(hasher: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous().reshape(-1)
        hasher.update(f"tensor {tensor.dtype} {tuple(value.shape)}:".encode())
        hasher.update(memoryview(tensor.view(torch.uint8).numpy()))
    elif isinstance(value, dict):
        hasher.update(b"{")
        for key, item in value.items():
            _feed(hasher, key)
            _feed(hasher, item)
        hasher.update(b"}")
    elif isinstance(value, list | tuple):
        hasher.update(b"[")
        for item in value:
            _feed(hasher, item)
        hasher.update(b"]")
    else:
        hasher.update(f"{type(value).__name__} {value!r};".encode())
