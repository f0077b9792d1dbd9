"""A worker process dies with the process that started it.

torchrun's agent starts each worker in a session of its own, and stops them when it is itself
stopped (Ctrl-C, SIGTERM); Python's multiprocessing (the concurrent profilers, the calibration
ranks) stops its children at a normal exit. Killed outright (SIGKILL, the OOM killer), neither
stops anything: the workers, re-parented to init, would train or measure on for good and hold
the launcher's output open. On
Linux the kernel sends a process a chosen signal when its parent exits (prctl
PR_SET_PDEATHSIG); where that is missing, a daemon thread watches for the parent to change.
SIGKILL, because the launcher that would take a graceful report is gone.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
WATCH_SECONDS = 1.0
LAUNCHER_PID_VARIABLE = "LAYERWISE_LAUNCHER_PID"


def die_with_parent(parent: int | None = None) -> None:
    """Be killed when the parent process (torchrun's agent, multiprocessing's parent or fork
    server) exits, from now on. `parent` is the pid the parent had: given, a parent gone
    before this line (the child is then already init's) is seen too; by default the current
    parent is taken as it."""
    parent = os.getppid() if parent is None else parent
    if not parent_death_signal(signal.SIGKILL):
        threading.Thread(target=_watch, args=(parent,), name="parent-watch", daemon=True).start()
    if os.getppid() != parent:  # it died before the signal was armed
        os.kill(os.getpid(), signal.SIGKILL)


def launcher_pid() -> int | None:
    """The pid of the launcher a tethered command (strategies/jobs/tether.py) became, as it
    passed it on to its children; None when the process was not started through a tether."""
    value = os.environ.get(LAUNCHER_PID_VARIABLE, "")
    return int(value) if value.isdigit() else None


def die_with_multiprocessing_parent() -> None:
    """die_with_parent for a child of Python's multiprocessing, whose starting process may be
    gone before this child runs its first line (it imports torch first: seconds): the child
    is then already init's, and the parent-death signal would never come. Under a fork server
    the signal comes from the server, which exits with the process that started it."""
    die_with_parent()
    parent = multiprocessing.parent_process()
    if parent is not None and not parent.is_alive():
        os.kill(os.getpid(), signal.SIGKILL)


def parent_death_signal(signum: int) -> bool:
    """Ask the kernel for `signum` when the parent exits; False where it cannot be asked."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(WATCH_SECONDS)
    os.kill(os.getpid(), signal.SIGKILL)
