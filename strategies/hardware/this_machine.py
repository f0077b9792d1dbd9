"""This machine's compute device: which one a command uses and the name it is recorded under
(a profile's file name and key, a run's result, a calibrated cluster's device)."""

from __future__ import annotations

import contextlib
import platform
from pathlib import Path

import torch

from layerwise.strategies.errors import LayerwiseError


def resolve_device(device: str | torch.device | None) -> torch.device:
    """`device`, or cuda when available else cpu; LayerwiseError for an unusable one."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise LayerwiseError(f"unknown device '{device}': use cpu or cuda") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise LayerwiseError(
            f"device '{device}' requested but this torch ({torch.__version__}) sees no CUDA "
            "device; use --device cpu"
        )
    if resolved.type not in ("cpu", "cuda"):
        raise LayerwiseError(f"device '{device}' is not supported: use cpu or cuda")
    return resolved


def device_name(device: str | torch.device = "cpu") -> str:
    """The GPU's name, or the CPU model (from /proc/cpuinfo where it exists)."""
    resolved = torch.device(device)
    if resolved.type == "cuda":
        return torch.cuda.get_device_name(resolved)
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name") and ":" in line:
                return " ".join(line.split(":", 1)[1].split())
    return platform.processor() or "cpu"
