"""Checkpoints of a layer-wise training run: one file that resumes it bit for bit.

Rank 0 writes `checkpoint.pt` in the run folder, atomically (a crash leaves the previous one):
the plain module's full state_dict, SGD's momentum buffers as full tensors keyed like the
state_dict (zeros where there is none), the step, the torch RNG state (dropout masks come from
the global generator, and on CUDA from the device's) and the records of the steps so far.
Shards live on many ranks, so saving is collective: every rank calls `save_checkpoint` and it
returns on all of them only when the file is in place, so a rank that dies right after a
checkpoint cannot lose it.

Resuming loads the same file on every rank (the run folder is shared, or on one machine) and
keeps each rank's part; the run then continues at step + 1 with the batches, masks and
momentum an uninterrupted run would have.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from strategies.errors import LayerwiseError
from strategies.files import atomic_path
from strategies.runtime.executor import LayerwiseModel
from strategies.runtime.result import StepRecord

CHECKPOINT_NAME = "checkpoint.pt"
SCHEMA_VERSION = 1


def save_checkpoint(path: Path, model: LayerwiseModel, optimizer: torch.optim.Optimizer | None,
                    step: int, records: list[StepRecord]) -> dict[str, torch.Tensor] | None:
    """Write the checkpoint of `step` (collective); returns the full state_dict on rank 0.

    `optimizer` is None on a rank that holds no weights under the strategy.
    """
    state = model.full_state_dict()
    momentum = model.gather(_momentum_buffers(model, optimizer), keys=model.parameter_keys())
    if state is not None:
        payload = {
            "schema_version": SCHEMA_VERSION,
            "step": step,
            "model": state,
            "momentum": momentum,
            "rng": torch.get_rng_state(),
            "cuda_rng": (torch.cuda.get_rng_state(model.device)
                         if model.device.type == "cuda" else None),
            "steps": [record.model_dump() for record in records],
        }
        with atomic_path(path) as temporary:
            torch.save(payload, temporary)
    model.comm.barrier()
    return state


def _momentum_buffers(model: LayerwiseModel,
                      optimizer: torch.optim.Optimizer | None) -> dict[str, torch.Tensor]:
    """SGD's momentum of this rank's weight shards, keyed like the state_dict.

    A weight without a buffer (no momentum, or no gradient yet) gets zeros, which SGD's next
    step treats as it treats a missing buffer; so every rank offers every key it owns and
    the collective gather matches on all ranks.
    """
    state = optimizer.state if optimizer is not None else {}
    buffers = {}
    for key, parameter in model.named_parameters():
        buffer = state.get(parameter, {}).get("momentum_buffer")
        buffers[key] = buffer if buffer is not None else torch.zeros_like(parameter)
    return buffers


def load_checkpoint(path: Path, model: LayerwiseModel,
                    optimizer: torch.optim.Optimizer | None) -> tuple[int, list[StepRecord]]:
    """Restore weights, buffers, momentum and RNG from `path`; returns (step, records)."""
    payload = _read(path)
    model.load_full_state_dict(payload["model"])
    if optimizer is not None:
        parts = model.scatter(payload["momentum"])
        for key, parameter in model.named_parameters():
            optimizer.state[parameter]["momentum_buffer"] = parts[key].clone()
    torch.set_rng_state(payload["rng"])
    if model.device.type == "cuda" and payload["cuda_rng"] is not None:
        torch.cuda.set_rng_state(payload["cuda_rng"], model.device)
    return int(payload["step"]), [StepRecord(**record) for record in payload["steps"]]


def checkpoint_step(path: Path) -> int | None:
    """The step a checkpoint file holds, without reading its tensors (None if there is none)."""
    if not path.is_file():
        return None
    return int(_read(path, mmap=True)["step"])


def _read(path: Path, mmap: bool = False) -> dict[str, Any]:
    payload = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    if payload.get("schema_version") != SCHEMA_VERSION:
        raise LayerwiseError(f"checkpoint {path} has schema_version "
                             f"{payload.get('schema_version')!r}, this layerwise reads "
                             f"{SCHEMA_VERSION}; start a new run")
    return payload
