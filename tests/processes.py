"""A launch seen from outside, for the fault tests: its processes (found in /proc by their
run folder, or as children), the sockets they listen on, and stopping whatever is left."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

import psutil

LOOPBACK = frozenset({"127.0.0.1", "::1", "::ffff:127.0.0.1"})


def as_from_a_terminal() -> None:
    """A child's Ctrl-C as a terminal user's process has it (`preexec_fn`): a suite started in
    the background of a shell without job control inherits SIGINT ignored, and so would every
    command it starts, which a test of Ctrl-C would then wait on for good."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def listening_addresses(root: psutil.Process) -> set[tuple[str, int]]:
    """The (address, port) pairs `root` and its descendants listen on."""
    found = set()
    for process in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            found |= {(connection.laddr.ip, connection.laddr.port)
                      for connection in process.net_connections(kind="inet")
                      if connection.status == psutil.CONN_LISTEN}
    return found


def torchrun_child(process: subprocess.Popen[str]) -> psutil.Process:
    """The torchrun `process` started (the CLI's other child sweeps its temporary folder)."""
    [child] = [child for child in psutil.Process(process.pid).children()
               if "--nproc-per-node" in child.cmdline()]
    return child


def processes_mentioning(text: str, working_in: Path | None = None) -> list[int]:
    """Live processes (not this one) whose command line contains `text` (a run folder: the
    workers'), and that work in `working_in` when given."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            alive = "zombie" not in (entry / "status").read_text()
            here = working_in is None or (entry / "cwd").resolve() == working_in
        except OSError:
            continue
        if text in command and alive and here:
            found.append(int(entry.name))
    return found


def kill_tree(process: subprocess.Popen[str]) -> None:
    """SIGKILL `process`, if it still runs, with every descendant, and reap it."""
    if process.poll() is not None:
        return
    with contextlib.suppress(psutil.NoSuchProcess):
        root = psutil.Process(process.pid)
        for member in [*root.children(recursive=True), root]:
            with contextlib.suppress(psutil.NoSuchProcess):
                member.kill()
    process.wait()
