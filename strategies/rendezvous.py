"""How processes started on this machine find each other to form a torch.distributed group.

The runtime's tests and benchmarks and the link calibration (calibrate.py) all start their
ranks themselves, on one machine, and need an init_method for them.
"""

from __future__ import annotations

import os
from pathlib import Path


def local_rendezvous(folder: str | os.PathLike[str]) -> str:
    """An init_method for processes on this machine: a file store in `folder` (fresh for each
    launch). A TCP port picked free in advance can be taken by another process before the
    store binds it; a file in one's own folder cannot."""
    return Path(folder, "rendezvous").absolute().as_uri()
