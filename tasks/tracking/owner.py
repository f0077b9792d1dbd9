"""Which process owns a record (an MLflow run, a Prefect flow run), and whether it is gone.

A process killed with SIGKILL closes nothing: what it was writing stays RUNNING for good. So every
record names its writer, by host, pid and the moment that process started (a pid alone may have been
reused since), and the next command on that host closes the records of a writer that no longer runs
(layerwise.tasks.tracking.track.close_orphaned_runs,
layerwise.flows.flow_runs.crash_orphaned_flow_runs).
"""

from __future__ import annotations

import os
import socket

import psutil

OWNER_HOST, OWNER_PID, OWNER_STARTED = "owner_host", "owner_pid", "owner_started_s"
_SAME_START_S = 0.05  # two reads of one process's start differ by float rounding only


def owner_tags() -> dict[str, str]:
    """This process as a record's owner: this host, this pid, and this process's start in
    seconds after boot (unlike a wall-clock time, unchanged when the clock is set)."""
    return {OWNER_HOST: socket.gethostname(), OWNER_PID: str(os.getpid()),
            OWNER_STARTED: f"{_seconds_after_boot(psutil.Process()):.2f}"}


def _seconds_after_boot(process: psutil.Process) -> float:
    return process.create_time() - psutil.boot_time()


def owner_gone(tags: dict[str, str]) -> bool:
    """Whether the process the owner tags name is known to have ended: they name this host, and
    no process has their pid, or the one that has it started at another moment, or it has
    exited. False when that cannot be told (another host; no tags, or not written by
    owner_tags)."""
    if tags.get(OWNER_HOST) != socket.gethostname():
        return False
    try:
        pid, started = int(tags[OWNER_PID]), float(tags[OWNER_STARTED])
    except (KeyError, ValueError):
        return False
    try:
        process = psutil.Process(pid)
        return (abs(_seconds_after_boot(process) - started) >= _SAME_START_S
                or process.status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def orphan_reason(tags: dict[str, str]) -> str:
    """What a record closed for its gone owner says of it."""
    return (f"its process (pid {tags.get(OWNER_PID)} on {tags.get(OWNER_HOST)}) ended without "
            "closing it: killed (SIGKILL) or the machine went down")
