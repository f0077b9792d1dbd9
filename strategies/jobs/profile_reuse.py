"""When a saved profile may be reused: the one rule of `layerwise profile` and the flow's
profile task.

A profile's t_c are times of the tiles of one layer graph at one global batch, measured on one
device with one torch and dtype, by a number of profilers at once (ranks that share a CPU slow
each other down). Reusing it for anything else would price Eq. 1 with times that are not this
run's, so every one of those is checked.
"""

from __future__ import annotations

from pathlib import Path

import torch
from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.graph import LayerGraph
from layerwise.strategies.profile import Profile
from layerwise.strategies.runtime.huge_pages import huge_pages_in_use


class ProfileMismatchError(LayerwiseError):
    """A readable profile file measured for another graph, device or process count."""


def reusable_profile(path: Path, graph: LayerGraph, device_name: str,
                     processes: int) -> Profile | None:
    """The profile at `path` to extend, or None when there is none (no file, or one measured
    by an older layerwise, to be measured again). LayerwiseError for a broken file;
    ProfileMismatchError when it is for another graph structure or batch, another device,
    torch, dtype or huge-page setting, or another process count."""
    existing = Profile.reusable(path)
    if existing is None:
        return None
    try:
        existing.check_matches(graph, source=path)
        existing.check_device(device_name, torch.__version__, huge_pages_in_use(), source=path)
        existing.check_processes(processes, source=path)
    except LayerwiseError as error:
        raise ProfileMismatchError(str(error)) from None
    return existing
