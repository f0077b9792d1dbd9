"""Launching a job: the run folder the workers read, the torchrun command, and torchrun in its
own process group, stopped as a whole on a deadline, Ctrl-C or SIGTERM, and with the launching
process even when that is killed outright (SIGKILL; layerwise.strategies.jobs.tether).

A blocked read of torchrun's output never notices a deadline, and an orchestrator's timeout
cannot interrupt it either, so a timer stops the process group itself. Rank 0's progress lines
and every other output line go to callables: the CLI draws a progress bar, the flow's task logs.
A launcher killed from outside (SIGKILL, the OOM killer) takes its workers with it
(strategies/processes/parent_death.py); the output is then no longer waited for.

On one machine torchrun and its workers meet through files in a private temporary folder
(strategies/hardware/rendezvous.py), so nothing of the run listens on the network; the nodes of a
run on several machines meet at node 0's --rdzv-endpoint, where node 0's launcher listens on
that address alone, and each launcher says which nodes it is waiting for
(strategies/hardware/node_rendezvous.py). Node 0 writes the run folder they share; each node
logs to its own torchrun log.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.files.atomic import write_atomic
from layerwise.strategies.files.locations import (
    ERRORS_DIR,
    GRAPH_FILE,
    LOG_FILE,
    RESULT_FILE,
    SETTINGS_FILE,
    STRATEGY_FILE,
)
from layerwise.strategies.hardware.node_rendezvous import (
    BACKEND,
    JOIN_SECONDS,
    NODE_RANK_CONFIG,
    JoinWatch,
    hosted_store,
)
from layerwise.strategies.hardware.rendezvous import loopback_environment
from layerwise.strategies.jobs.failure import RankFailure, failure_line
from layerwise.strategies.jobs.job import Job, total_steps
from layerwise.strategies.jobs.run_folder import node_file_name
from layerwise.strategies.jobs.tether import tethered
from layerwise.strategies.processes.huge_pages import with_huge_pages
from layerwise.strategies.processes.owned_folder import owned_folder
from layerwise.strategies.processes.terminate import terminate_as_exit
from layerwise.strategies.runtime.worker import ERROR_PREFIX, PROGRESS_PREFIX
from layerwise.strategies.training_run import RunResult

AGENT_MODULE = "layerwise.strategies.jobs.agent"  # torchrun, its ranks forked from its agent
STOP_GRACE_SECONDS = 10.0
POLL_SECONDS = 0.5
WATCH_SECONDS = 10.0  # how often a launcher says which nodes it still waits for
FIRST_WATCH_SECONDS = 2.0  # when it first says so: nodes that meet at once say nothing
# How long the output may stay open after torchrun is gone: its workers die with it at once,
# so only workers stuck past their parent-death signal are left, and they are not waited for.
ORPHANED_OUTPUT_SECONDS = 5.0


class TrainingFailed(LayerwiseError):
    """torchrun exited non-zero; the message names the rank that failed first and its error."""


class StepProgress(NamedTuple):
    """One of rank 0's progress lines: the step just finished, the last step, its loss and
    its time in seconds."""

    step: int
    steps: int
    loss: float
    seconds: float


def torchrun_command(job: Job, total: int, checkpoint_every: int | None, timeout: float,
                     also: Sequence[Path] = (), reference: Path | None = None) -> list[str]:
    """torchrun (its ranks forked from its agent: strategies/jobs/agent.py) starting the
    job's workers on this node, to train until step `total`
    (checkpointing every `checkpoint_every` steps, None: never); the run folders `also`
    (written like the job's, same processes) train after it in the same workers; with a
    `reference` (a saved `ReferenceRun`) each run writes its divergence from it, not its
    weights."""
    command = [sys.executable, "-m", AGENT_MODULE]
    if job.settings.nnodes > 1:
        command += ["--nnodes", str(job.settings.nnodes), "--rdzv-backend", BACKEND,
                    "--rdzv-endpoint", str(job.rdzv_endpoint),
                    "--rdzv-conf", f"{NODE_RANK_CONFIG}={job.node_rank}"]
    command += ["--nproc-per-node", str(job.settings.nproc), "--max-restarts", "0"]
    command += ["-m", "layerwise.strategies.runtime.worker", "--out", str(job.out), *map(str, also),
                "--steps", str(total), "--timeout", str(timeout)]
    command += (["--no-checkpoint"] if checkpoint_every is None
                else ["--checkpoint-every", str(checkpoint_every)])
    if job.checkpoint is not None:
        command += ["--resume", str(job.checkpoint)]
    if reference is not None:
        command += ["--reference", str(reference)]
    return command


def log_path(job: Job) -> Path:
    """This node's torchrun log in the run folder."""
    return job.out / node_file_name(LOG_FILE, job.node_rank)


def write_run_folder(job: Job) -> None:
    """What the workers read; stale error files of an earlier attempt go. Node 0 writes it
    for every node: the others' workers start only once node 0 has joined the rendezvous."""
    if job.node_rank > 0:
        return
    job.strategy.save(job.out / STRATEGY_FILE)
    job.settings.save(job.out / SETTINGS_FILE)
    write_atomic(job.out / GRAPH_FILE, job.graph.model_dump_json() + "\n")
    shutil.rmtree(job.out / ERRORS_DIR, ignore_errors=True)


def _ignore(_: object) -> None:
    return None


def run_torchrun(command: list[str], job: Job,
                 on_line: Callable[[str], None] = _ignore,
                 on_progress: Callable[[StepProgress], None] = _ignore,
                 deadline_s: float | None = None,
                 on_failure: Callable[[RankFailure], None] = _ignore) -> int:
    """Run torchrun in its own process group; returns its exit code.

    Its stderr (torchrun's and the workers' logs and tracebacks) goes to this node's torchrun
    log in the run folder; its stdout goes to `on_progress` (rank 0's progress lines),
    `on_failure` (a rank's error it could not write to the run folder) and `on_line`
    (everything else, without the newline). If the launcher is stopped (Ctrl-C, or
    SIGTERM from a scheduler), the whole group is stopped with it. With `deadline_s`, a timer
    stops the group when it runs longer and TimeoutError is raised. If the launcher is killed
    outright (SIGKILL), torchrun gets SIGTERM and stops its workers; torchrun killed from
    outside returns its negative exit code (its workers die with it).
    """
    with (open(log_path(job), "a", encoding="utf-8") as log, terminate_as_exit(),
          _rendezvous(job) as launch):
        environment = launch.environment
        log.write(f"$ {' '.join([*(f'{k}={v}' for k, v in environment.items()), *command])}\n")
        log.flush()
        process = subprocess.Popen(tethered(command), stdout=subprocess.PIPE, stderr=log,
                                   env={**with_huge_pages(os.environ), "PYTHONUNBUFFERED": "1",
                                        **environment},
                                   start_new_session=True)
        expired, ended, stalled = threading.Event(), threading.Event(), []
        timer = _deadline_timer(process, expired, deadline_s)
        _watch_joining(process, launch.watch, ended, on_line, stalled)
        try:
            _follow(process, on_line, on_progress, on_failure)
            code = process.wait()
        except BaseException:
            _stop(process)
            raise
        finally:
            ended.set()
            if timer is not None:
                timer.cancel()
    if expired.is_set():
        raise TimeoutError(f"training ran past its deadline of {deadline_s:g} s; torchrun and "
                           f"its workers were stopped (log: {log_path(job)})")
    if stalled:
        raise TrainingFailed(f"the nodes did not all join within {JOIN_SECONDS:g} s, so this "
                             f"node stopped: {stalled[0]}; start every node's `layerwise train` "
                             f"with its own --node-rank")
    return code


def run_job(job: Job, steps: int | None, epochs: int | None, checkpoint_every: int | None,
            timeout: float, *, on_warning: Callable[[str], None] = _ignore,
            on_line: Callable[[str], None] = _ignore,
            on_progress: Callable[[StepProgress], None] = _ignore,
            deadline_s: float | None = None) -> RunResult:
    """Train `job` (claimed and checked; held by the caller): its warnings to `on_warning`,
    the run folder written, torchrun run to its end, and rank 0's RunResult read back. The one
    launch of `layerwise train` and the flow's train task.

    `steps` or `epochs` (one of them; a resumed job's own otherwise) bound the run, a
    checkpoint every `checkpoint_every` steps (None: never), `timeout` seconds for a
    collective; `on_line` and `on_progress` are `run_torchrun`'s, as is `deadline_s`.
    TrainingFailed, naming the rank that failed first, when torchrun exits non-zero.
    """
    total = total_steps(job, steps, epochs)
    command = torchrun_command(job, total, checkpoint_every, timeout)
    for warning in job.warnings:
        on_warning(warning)
    write_run_folder(job)
    unwritten: list[RankFailure] = []
    code = run_torchrun(command, job, on_line=on_line, on_progress=on_progress,
                        deadline_s=deadline_s, on_failure=unwritten.append)
    if code != 0:
        raise TrainingFailed(failure_line(job.out, code, job.settings.nproc,
                                          job.settings.nnodes, job.node_rank, unwritten))
    return RunResult.load(job.out / RESULT_FILE)


class Launch(NamedTuple):
    """What a launch runs in: torchrun's environment, and on several machines how the nodes'
    gathering is watched."""

    environment: dict[str, str]
    watch: JoinWatch | None


@contextlib.contextmanager
def _rendezvous(job: Job) -> Iterator[Launch]:
    """The environment of a launch: a private temporary folder, removed after it however it
    ends (strategies/processes/owned_folder.py), as the TMPDIR of torchrun and its workers
    (torchrun leaves a torchelastic_* folder in TMPDIR at every launch); on one machine also
    the file stores there that make the processes meet without TCP stores on every interface.
    The nodes of a run on several machines meet at the store node 0's launcher hosts on its
    --rdzv-endpoint for as long as the launch lasts."""
    with owned_folder("layerwise-rendezvous-") as folder:
        private = {"TMPDIR": str(folder)}
        if job.settings.nnodes == 1:
            yield Launch({**private, **loopback_environment(folder)}, None)
            return
        endpoint = job.rdzv_endpoint
        assert endpoint is not None  # check_nodes gave it for a run on several nodes
        with (hosted_store(endpoint) if job.node_rank == 0
              else contextlib.nullcontext()) as store:
            yield Launch(private, JoinWatch(endpoint, job.settings.nnodes, store))


def _watch_joining(process: subprocess.Popen[bytes], watch: JoinWatch | None,
                   ended: threading.Event, on_line: Callable[[str], None],
                   stalled: list[str]) -> None:
    """After FIRST_WATCH_SECONDS, then every WATCH_SECONDS until all nodes have joined (or
    `ended`), the line saying which are missing to `on_line`; past JOIN_SECONDS that line
    goes to `stalled` and the launch is stopped. Nothing to watch on one machine."""
    if watch is None:
        return

    def follow() -> None:
        deadline, wait = time.monotonic() + JOIN_SECONDS, FIRST_WATCH_SECONDS
        while not ended.wait(wait):
            wait = WATCH_SECONDS
            missing = watch.missing()
            if missing is None:
                return
            on_line(missing)
            if time.monotonic() > deadline:
                stalled.append(missing)
                _stop(process)
                return

    threading.Thread(target=follow, name="layerwise-join-watch", daemon=True).start()


def _follow(process: subprocess.Popen[bytes], on_line: Callable[[str], None],
            on_progress: Callable[[StepProgress], None],
            on_failure: Callable[[RankFailure], None]) -> None:
    """Hand each of rank 0's progress lines to `on_progress`, every other line to `on_line`,
    until the output closes, or until torchrun has been gone ORPHANED_OUTPUT_SECONDS while
    something still holds it open. The pipe is closed then: a rank 0 that outlived its
    launcher fails at its next line, and the other ranks on the lost connection."""
    assert process.stdout is not None
    descriptor, pending, gone_since = process.stdout.fileno(), b"", None
    with selectors.DefaultSelector() as selector, process.stdout:
        selector.register(descriptor, selectors.EVENT_READ)
        while True:
            if selector.select(timeout=POLL_SECONDS):
                chunk = os.read(descriptor, 1 << 16)
                if not chunk:
                    break
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    _hand_on(line, on_line, on_progress, on_failure)
            if process.poll() is not None:
                gone_since = gone_since or time.monotonic()
                if time.monotonic() - gone_since > ORPHANED_OUTPUT_SECONDS:
                    break
    if pending:
        _hand_on(pending, on_line, on_progress, on_failure)


def _hand_on(line: bytes, on_line: Callable[[str], None],
             on_progress: Callable[[StepProgress], None],
             on_failure: Callable[[RankFailure], None]) -> None:
    text = line.decode("utf-8", errors="replace").rstrip("\r")
    if text.startswith(PROGRESS_PREFIX):
        progress = json.loads(text[len(PROGRESS_PREFIX):])
        on_progress(StepProgress(progress["step"], progress["steps"], progress["loss"],
                                 progress["seconds"]))
    elif text.startswith(ERROR_PREFIX):
        on_failure(json.loads(text[len(ERROR_PREFIX):]))
    else:
        on_line(text)


def _deadline_timer(process: subprocess.Popen[bytes], expired: threading.Event,
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


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Terminate torchrun and its workers; kill them if they do not go within a grace time.
    A launcher already reaped is left alone: its group is empty and its id may be reused."""
    if process.returncode is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=STOP_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        return
