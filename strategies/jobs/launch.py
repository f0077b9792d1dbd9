"""Launching a job: the run folder the workers read, the torchrun command, and torchrun in its
own process group, stopped as a whole on a deadline, Ctrl-C or SIGTERM.

A blocked read of torchrun's output never notices a deadline, and an orchestrator's timeout
cannot interrupt it either, so a timer stops the process group itself. Rank 0's progress lines
and every other output line go to callables: the CLI draws a progress bar, the flow's task logs.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, NamedTuple

from strategies.errors import LayerwiseError
from strategies.files import write_atomic
from strategies.jobs.job import Job
from strategies.runtime.worker import (
    ERRORS_DIR,
    GRAPH_FILE,
    PROGRESS_PREFIX,
    SETTINGS_FILE,
    STRATEGY_FILE,
)

LOG_FILE = "torchrun.log"
STOP_GRACE_SECONDS = 10.0


class StepProgress(NamedTuple):
    """One of rank 0's progress lines: the step just finished, the last step, its loss."""

    step: int
    steps: int
    loss: float


def torchrun_command(job: Job, total: int, checkpoint_every: int | None, timeout: float,
                     node_rank: int | None, rdzv_endpoint: str | None,
                     also: Sequence[Path] = ()) -> list[str]:
    """torchrun starting the job's workers on this node, to train until step `total`
    (checkpointing every `checkpoint_every` steps, None: never); the run folders `also`
    (written like the job's, same processes) train after it in the same workers."""
    command = [sys.executable, "-m", "torch.distributed.run",
               "--nproc-per-node", str(job.settings.nproc), "--max-restarts", "0"]
    if job.settings.nnodes > 1:
        if node_rank is None or rdzv_endpoint is None:
            raise LayerwiseError("several nodes need --node-rank (this machine's index) and "
                                 "--rdzv-endpoint HOST:PORT (node 0's address)")
        command += ["--nnodes", str(job.settings.nnodes), "--node-rank", str(node_rank),
                    "--rdzv-endpoint", rdzv_endpoint]
    elif node_rank is not None or rdzv_endpoint is not None:
        raise LayerwiseError("--node-rank and --rdzv-endpoint are for --nnodes > 1")
    command += ["-m", "strategies.runtime.worker", "--out", str(job.out), *map(str, also),
                "--steps", str(total), "--timeout", str(timeout)]
    command += (["--no-checkpoint"] if checkpoint_every is None
                else ["--checkpoint-every", str(checkpoint_every)])
    if job.checkpoint is not None:
        command += ["--resume", str(job.checkpoint)]
    return command


def write_run_folder(job: Job) -> None:
    """What the workers read; stale error files of an earlier attempt go."""
    job.out.mkdir(parents=True, exist_ok=True)
    job.strategy.save(job.out / STRATEGY_FILE)
    job.settings.save(job.out / SETTINGS_FILE)
    write_atomic(job.out / GRAPH_FILE, job.graph.model_dump_json() + "\n")
    shutil.rmtree(job.out / ERRORS_DIR, ignore_errors=True)


def _ignore(_: object) -> None:
    return None


def run_torchrun(command: list[str], job: Job,
                 on_line: Callable[[str], None] = _ignore,
                 on_progress: Callable[[StepProgress], None] = _ignore,
                 deadline_s: float | None = None) -> int:
    """Run torchrun in its own process group; returns its exit code.

    Its stderr (torchrun's and the workers' logs and tracebacks) goes to torchrun.log in the
    run folder; its stdout goes to `on_progress` (rank 0's progress lines) and `on_line`
    (everything else, without the newline). If the launcher is stopped (Ctrl-C, or SIGTERM
    from a scheduler), the whole group is stopped with it. With `deadline_s`, a timer stops
    the group when it runs longer and TimeoutError is raised.
    """
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(job.out / LOG_FILE, "a", encoding="utf-8") as log, _terminate_as_exit():
        log.write(f"$ {' '.join(command)}\n")
        log.flush()
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True,
                                   env=environment, start_new_session=True)
        expired = threading.Event()
        timer = _deadline_timer(process, expired, deadline_s)
        try:
            assert process.stdout is not None
            _follow(process.stdout, on_line, on_progress)
            code = process.wait()
        except BaseException:
            _stop(process)
            raise
        finally:
            if timer is not None:
                timer.cancel()
    if expired.is_set():
        raise TimeoutError(f"training ran past its deadline of {deadline_s:g} s; torchrun and "
                           f"its workers were stopped (log: {job.out / LOG_FILE})")
    return code


def _follow(lines: IO[str], on_line: Callable[[str], None],
            on_progress: Callable[[StepProgress], None]) -> None:
    """Hand each of rank 0's progress lines to `on_progress`, every other line to `on_line`."""
    for line in lines:
        if line.startswith(PROGRESS_PREFIX):
            progress = json.loads(line[len(PROGRESS_PREFIX):])
            on_progress(StepProgress(progress["step"], progress["steps"], progress["loss"]))
        else:
            on_line(line.rstrip("\n"))


def _deadline_timer(process: subprocess.Popen[str], expired: threading.Event,
                    deadline_s: float | None) -> threading.Timer | None:
    """A started timer that stops `process`'s group after `deadline_s` and sets `expired`."""
    if deadline_s is None:
        return None

    def expire() -> None:
        expired.set()
        _stop(process)

    timer = threading.Timer(deadline_s, expire)
    timer.daemon = True
    timer.start()
    return timer


@contextlib.contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """Let SIGTERM unwind the launcher like Ctrl-C does (main thread only, where Python allows
    handlers), so that the torchrun group it started is stopped rather than orphaned."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def exit_on_terminate(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_on_terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stop(process: subprocess.Popen[str]) -> None:
    """Terminate torchrun and its workers; kill them if they do not go within a grace time."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=STOP_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        return
