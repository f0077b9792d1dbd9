"""Temporary folders removed on every way out of the process that made them, SIGKILL included.

`tempfile.TemporaryDirectory` removes its folder when its block ends: a SIGKILL, the OOM
killer or an unhandled SIGTERM end the process without that, and a launch's folder (torchrun's
stores and torchelastic files, the profilers' results, a verify's reference weights, gigabytes
for VGG-16) stays behind. So each folder gets a sweeper: a small child process that waits on a
pidfd for its maker to end and then removes the folder. On a normal exit the maker removes the
folder itself and stops the sweeper. Our own children die with us (SIGKILL at the parent's
death, strategies/processes/parent_death.py), so a second pass after SETTLE_SECONDS removes
what a child's last system call may have recreated. Off Linux (no pidfd) no sweeper starts.

    python -m layerwise.strategies.processes.owned_folder PARENT FOLDER   # the sweeper
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

SETTLE_SECONDS = 0.5
SUPPORTED = sys.platform.startswith("linux") and hasattr(os, "pidfd_open")


@contextlib.contextmanager
def owned_folder(prefix: str, parent: str | Path | None = None) -> Iterator[Path]:
    """A new private folder (mode 0700) in `parent` (the system's temporary folder when
    None), removed when the block ends or, if this process is killed, by its sweeper."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    sweeper = None
    try:
        sweeper = _start_sweeper(folder)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        if sweeper is not None:
            sweeper.terminate()
            sweeper.wait()


def _start_sweeper(folder: Path) -> subprocess.Popen[bytes] | None:
    if not SUPPORTED:
        return None
    return subprocess.Popen([sys.executable, "-m", __name__, str(os.getpid()), str(folder)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            start_new_session=True)  # a Ctrl-C on the terminal is not ours


def _sweep_when_gone(parent: int, folder: Path) -> None:
    try:
        watched = os.pidfd_open(parent)
    except ProcessLookupError:  # gone before we looked
        watched = None
    if watched is not None and os.getppid() == parent:  # else the pid is another process's
        select.select([watched], [], [])
    shutil.rmtree(folder, ignore_errors=True)
    time.sleep(SETTLE_SECONDS)
    shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str]) -> None:
    parent, folder = argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _sweep_when_gone(int(parent), Path(folder))


if __name__ == "__main__":
    main(sys.argv[1:])
