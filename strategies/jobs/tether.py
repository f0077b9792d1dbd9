"""Processes that end with the process that started them, however it ends.

A process killed with SIGKILL runs no handler and no atexit: what it started (torchrun and its
workers, Prefect's temporary API server) is re-parented to init and goes on, training or
listening on 127.0.0.1 with nobody to stop it. Linux can signal a child when its parent dies
(prctl PR_SET_PDEATHSIG), but only the child can ask, after the fork. So:

- a command we start runs through this module (`tethered`): it asks for SIGTERM at its
  parent's death and then becomes the command (exec keeps the request); torchrun's agent
  answers SIGTERM by stopping its workers;
- a process someone else starts (Prefect starts its server) gets a guard (`guard`): a child
  of ours that waits for our death and then stops that process (SIGTERM, SIGKILL after a
  grace). It holds the process by a pidfd, so a reused pid is never signalled.

The signal comes when the *thread* that started the child ends: launch.run_torchrun waits for
its child in that thread, and the CLI starts its guard from the main thread. Elsewhere than on
Linux neither exists: commands run as given and no guard starts.

    python -m layerwise.strategies.jobs.tether PARENT -- COMMAND...   # COMMAND, ended with PARENT
    python -m layerwise.strategies.jobs.tether PARENT --stop PID       # stops PID when PARENT ends
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from collections.abc import Sequence

from layerwise.strategies.processes.parent_death import LAUNCHER_PID_VARIABLE, parent_death_signal

STOP_GRACE_SECONDS = 5.0
SUPPORTED = sys.platform.startswith("linux")


def tethered(command: Sequence[str]) -> list[str]:
    """`command` started so that it gets SIGTERM when this process dies."""
    if not SUPPORTED:
        return list(command)
    return [sys.executable, "-m", __name__, str(os.getpid()), "--", *command]


def guard(pid: int) -> subprocess.Popen[bytes] | None:
    """Start a process that stops process `pid` when this process dies; None off Linux."""
    if not SUPPORTED:
        return None
    return subprocess.Popen([sys.executable, "-m", __name__, str(os.getpid()), "--stop",
                             str(pid)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)


def _exec_tethered(parent: int, command: list[str]) -> None:
    if not parent_death_signal(signal.SIGTERM):
        raise OSError("prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # it died before the request could see it: do not start
        sys.exit(128 + signal.SIGTERM)
    # the command keeps this pid: its children (torchrun's workers) check it is still theirs
    os.environ[LAUNCHER_PID_VARIABLE] = str(os.getpid())
    os.execvp(command[0], command)


def _stop_when_gone(parent: int, target: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the parent to handle
    try:
        guarded = os.pidfd_open(target)
    except ProcessLookupError:
        return
    try:
        watched = os.pidfd_open(parent)
    except ProcessLookupError:
        _stop(guarded)
        return
    if os.getppid() != parent:  # the pidfd may hold a process that reused the pid
        _stop(guarded)
        return
    poller = select.poll()
    poller.register(watched, select.POLLIN)
    poller.register(guarded, select.POLLIN)
    if guarded not in {fd for fd, _ in poller.poll()}:
        _stop(guarded)


def _stop(pidfd: int) -> None:
    """SIGTERM, then SIGKILL if the process is still there after the grace time."""
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        if not select.select([pidfd], [], [], STOP_GRACE_SECONDS)[0]:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except ProcessLookupError:
        return


def main(argv: list[str]) -> None:
    parent, mode, *rest = argv
    if mode == "--stop":
        _stop_when_gone(int(parent), int(rest[0]))
    else:
        _exec_tethered(int(parent), rest)


if __name__ == "__main__":
    main(sys.argv[1:])
