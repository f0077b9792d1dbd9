"""A torchrun worker dies with its launcher.

torchrun's agent starts each worker in a session of its own, and stops them when it is itself
stopped (Ctrl-C, SIGTERM). Killed outright (SIGKILL, the OOM killer), it stops nothing: its
workers, re-parented to init, would train on for good and hold the launcher's output open. On
Linux the kernel sends a process a chosen signal when its parent exits (prctl
PR_SET_PDEATHSIG); where that is missing, a daemon thread watches for the parent to change.
SIGKILL, because the launcher that would take a graceful report is gone.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
WATCH_SECONDS = 1.0


def die_with_parent() -> None:
    """Be killed when the parent process (torchrun's agent) exits, from now on."""
    parent = os.getppid()
    if not parent_death_signal(signal.SIGKILL):
        threading.Thread(target=_watch, args=(parent,), name="parent-watch", daemon=True).start()
    if os.getppid() != parent:  # it died before the signal was armed
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
