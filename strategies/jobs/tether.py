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
  grace). It holds the process by a pidfd, so a reused pid is never signalled. A guard given
  a pid is armed only once that process exists, so a death between the two leaves it running;
  where that matters (`timeout` often stops a run in the seconds Prefect's server takes to
  start) the guard starts first (`guarding_what_starts`): the processes started inside the
  block carry a mark in their environment from their first instruction, and at our death the
  guard stops every process that carries it.

The signal comes when the *thread* that started the child ends: launch.run_torchrun waits for
its child in that thread, and the CLI starts its guard from the main thread. Elsewhere than on
Linux neither exists: commands run as given and no guard starts.

    python -m layerwise.strategies.jobs.tether PARENT -- COMMAND...   # COMMAND, ended with PARENT
    python -m layerwise.strategies.jobs.tether PARENT --stop PID       # stops PID when PARENT ends
    python -m layerwise.strategies.jobs.tether PARENT --stop-marked MARK  # and those marked MARK
"""

from __future__ import annotations

import contextlib
import os
import secrets
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence

from layerwise.strategies.processes.parent_death import LAUNCHER_PID_VARIABLE, parent_death_signal

STOP_GRACE_SECONDS = 5.0
SUPPORTED = sys.platform.startswith("linux")
# the environment variable `guarding_what_starts` marks processes with
MARK_VARIABLE = "LAYERWISE_GUARD_MARK"
# a marked guard looks for marked processes twice this far apart: a process forked before our
# death but not yet running its command carries no mark at the first look
MARKED_LOOKS_APART_SECONDS = 0.5


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


@contextlib.contextmanager
def guarding_what_starts() -> Iterator[None]:
    """Every process started inside the block with this process's environment (`os.environ`,
    which the block marks: MARK_VARIABLE) is stopped when this process dies, however soon after
    its start: the guard is started before the block runs. The mark leaves `os.environ` when
    the block ends; off Linux the block runs as it is."""
    if not SUPPORTED:
        yield
        return
    mark = f"{os.getpid()}-{secrets.token_hex(8)}"
    subprocess.Popen([sys.executable, "-m", __name__, str(os.getpid()), "--stop-marked", mark],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    os.environ[MARK_VARIABLE] = mark
    try:
        yield
    finally:
        os.environ.pop(MARK_VARIABLE, None)


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


def _stop_marked_when_gone(parent: int, mark: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the parent to handle
    try:
        watched = os.pidfd_open(parent)
    except ProcessLookupError:
        watched = None
    if watched is not None and os.getppid() == parent:  # else it is gone already
        select.select([watched], [], [])  # readable when the parent ends
    # let go of the output the parent shared: whoever reads its pipe is not kept waiting for
    # the second look
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, sys.stderr.fileno())
    for look in range(2):
        if look:
            time.sleep(MARKED_LOOKS_APART_SECONDS)
        for pidfd in _marked(mark):
            _stop(pidfd)
            os.close(pidfd)


def _marked(mark: str) -> Iterator[int]:
    """A pidfd of each live process (not this one) whose environment holds `mark`, opened
    before its environment is read: a pid reused in between is read as the new process's."""
    entry = f"{MARK_VARIABLE}={mark}".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            pidfd = os.pidfd_open(int(name))
        except OSError:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as environ:
                marked = entry in environ.read().split(b"\0")
        except OSError:
            marked = False
        if marked:
            yield pidfd
        else:
            os.close(pidfd)


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
    elif mode == "--stop-marked":
        _stop_marked_when_gone(int(parent), rest[0])
    else:
        _exec_tethered(int(parent), rest)


if __name__ == "__main__":
    main(sys.argv[1:])
