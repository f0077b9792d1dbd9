"""Faults a user meets around a run: two runs tracking at once, Ctrl-C, SIGTERM, SIGKILL of
the launcher or of the flow, a deadline, runs left open by a killed flow; and what a run exposes
to the network meanwhile.

Real components only: two spawned processes on one fresh MLflow SQLite store; `layerwise train`
and `layerwise run` as subprocesses whose torchrun workers and Prefect server are found in /proc
by their run folder or working directory, and whose sockets psutil lists.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from mlflow import MlflowClient

from layerwise.strategies.files.locations import ERRORS_DIR
from layerwise.strategies.jobs.job import new_job
from layerwise.strategies.jobs.launch import run_torchrun, torchrun_command, write_run_folder
from layerwise.strategies.jobs.options import TrainOptions
from layerwise.tasks.tracking import owner, track
from tests.processes import (
    LOOPBACK,
    as_from_a_terminal,
    kill_tree,
    listening_addresses,
    processes_mentioning,
    torchrun_child,
)

pytestmark = pytest.mark.slow

LAYERWISE = Path(sys.executable).parent / "layerwise"
LONG_RUN = ("tiny_cnn", "--strategy", "data", "--nproc", "2", "--image-size", "8",
            "--batch-per-device", "4", "--steps", "100000")
WAIT_SECONDS = 120  # far above what starting or stopping takes; reached only on a hang
# what stopping after a SIGKILL may take: the guard's grace for Prefect's server is 5 s; an
# orphaned server used to listen for minutes
STOP_SECONDS = 30
# the benchmark flow, short but for its training (until stopped), in a project of its own
FLOW_RUN = ("run", "--set", "dataset=synthetic", "--set", "image_size=8", "--set",
            "batch_per_device=4", "--set", "steps=100000", "--set", "strategies=[data]",
            "--set", "profile=false", "--set", "cluster=local", "--set", "verify_steps=0")
METRIC_STEPS = 20


def _track_concurrently(uri: str, barrier, index: int, results) -> None:
    os.environ[track.TRACKING_VARIABLE] = uri
    barrier.wait(WAIT_SECONDS)  # both open the fresh store at the same moment
    try:
        client, experiment_id = track.open_experiment("concurrent")
        with track.benchmark_run(client, experiment_id, f"flow-{index}", {"index": index},
                                 {"writer": str(index)}) as run_id:
            for step in range(METRIC_STEPS):
                client.log_metric(run_id, "loss", float(step), step=step)
            track.finish_run(client, run_id)
        results.put(("ok", run_id))
    except Exception as error:  # reported to the test, which fails with it
        results.put(("error", f"{type(error).__name__}: {error}"))


def test_two_flows_tracking_into_one_new_store_at_once_both_land(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(2), context.Queue()
    writers = [context.Process(target=_track_concurrently, args=(uri, barrier, index, results))
               for index in range(2)]
    for writer in writers:
        writer.start()
    outcomes = [results.get(timeout=WAIT_SECONDS) for _ in writers]
    for writer in writers:
        writer.join(WAIT_SECONDS)
    assert [status for status, _ in outcomes] == ["ok", "ok"], outcomes
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("concurrent")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(run.data.tags["writer"] for run in runs) == ["0", "1"]
    for run in runs:
        history = client.get_metric_history(run.info.run_id, "loss")
        assert sorted(metric.step for metric in history) == list(range(METRIC_STEPS))
        assert run.info.status == "FINISHED"


def _wait_for(condition, what: str, seconds: float = WAIT_SECONDS) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.2)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the workers in /proc")
@pytest.mark.parametrize("target, stop_signal", [
    ("cli", signal.SIGINT), ("cli", signal.SIGTERM), ("torchrun", signal.SIGKILL)],
    ids=["ctrl-c", "sigterm", "sigkill-torchrun"])
def test_stopping_the_launcher_leaves_no_worker_behind(tmp_path, target, stop_signal):
    """Also: the run listens on the loopback only (torchrun's rendezvous and the workers' gloo
    pairs), and a torchrun killed outright takes its workers with it (killed: no rank records
    an error) while the CLI ends with one line."""
    out, temporary = tmp_path / "run", _private_temporary_folder(tmp_path)
    launcher = subprocess.Popen([str(LAYERWISE), "train", *LONG_RUN, "--checkpoint-every", "5",
                                 "--out", str(out)], preexec_fn=as_from_a_terminal,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                cwd=tmp_path, env={**os.environ, "TMPDIR": str(temporary)})
    try:
        _wait_for(lambda: (out / "checkpoint.pt").exists() or launcher.poll() is not None,
                  "the workers to train")
        assert launcher.poll() is None, launcher.stderr.read() if launcher.stderr else ""
        torchrun = torchrun_child(launcher)
        ranks = torchrun.children()  # forks of the agent, not interpreters of their own
        assert len(ranks) == 2 and all(rank.cmdline() == torchrun.cmdline() for rank in ranks)
        listening = listening_addresses(torchrun)
        assert len(listening) >= 2  # a gloo pair per worker at least
        assert {address for address, _ in listening} <= LOOPBACK, listening
        victim = launcher if target == "cli" else torchrun
        victim.send_signal(stop_signal)
        _, stderr = launcher.communicate(timeout=WAIT_SECONDS)
        assert launcher.returncode != 0
        _wait_for(lambda: not processes_mentioning(str(out)), "the workers to stop")
        _wait_for_no_leftovers(temporary)
        if target == "torchrun":
            lines = [line for line in stderr.splitlines() if line.strip()]
            assert len(lines) == 1 and "torchrun was killed (SIGKILL)" in lines[0], stderr
            assert not (out / ERRORS_DIR).exists()
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for pid in processes_mentioning(str(out)):
            os.kill(pid, signal.SIGKILL)


def test_a_run_past_its_deadline_is_stopped_with_its_workers(tmp_path):
    out = tmp_path / "run"
    options = TrainOptions(nproc=2, image_size=8, batch_per_device=4)
    with new_job("tiny_cnn", "data", options, out, analytic=True) as job:
        command = torchrun_command(job, 100000, 100000, 60.0)
        write_run_folder(job)
        with pytest.raises(TimeoutError, match="deadline of 8 s"):
            run_torchrun(command, job, deadline_s=8.0)
    _wait_for(lambda: not processes_mentioning(str(out)), "the workers to stop")


# A launcher that is gone at once, leaving a process that holds its output open for good (as
# workers that outlived a killed torchrun would, had they no parent-death signal).
ORPHANING_LAUNCHER = [sys.executable, "-c", (
    "import subprocess, sys\n"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', sys.argv[1]])\n"
    "sys.exit(3)\n")]


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the orphan in /proc")
def test_output_held_open_after_the_launcher_is_gone_is_not_waited_for(tmp_path):
    out, marker = tmp_path / "run", f"orphan-of-{tmp_path.name}"
    codes: list[int] = []
    with new_job("tiny_cnn", "data", TrainOptions(nproc=1, image_size=8), out,
                 analytic=True) as job:
        follower = threading.Thread(
            target=lambda: codes.append(run_torchrun([*ORPHANING_LAUNCHER, marker], job)),
            daemon=True)
        try:
            follower.start()
            follower.join(WAIT_SECONDS)
            assert codes == [3]  # the launcher's own code, not a wait on the orphan's pipe
        finally:
            for pid in processes_mentioning(marker):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def flow_project(tmp_path_factory) -> Path:
    """One project folder for the tests that start `layerwise run`: the first migrates its
    Prefect database (~20 s on 2 cores), the next reuses it."""
    return tmp_path_factory.mktemp("project").resolve()


def _private_temporary_folder(parent: Path) -> Path:
    """A TMPDIR of the test's own, to see what a stopped command leaves in it."""
    folder = parent / "tmp"
    folder.mkdir()
    return folder


def _wait_for_no_leftovers(temporary: Path) -> None:
    """Wait until `temporary` holds nothing a command made for itself. torch's compile cache
    (torchinductor_USER, made when torch.optim first loads) is kept by design, for every later
    torch process to share."""
    def leftovers() -> list[str]:
        return [path.name for path in temporary.iterdir()
                if not path.name.startswith("torchinductor_")]
    deadline = time.monotonic() + STOP_SECONDS
    while leftovers() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not leftovers(), f"left in TMPDIR: {leftovers()}"


def _start_flow(project: Path, experiment: str,
                temporary: Path | None = None) -> subprocess.Popen[bytes]:
    """`layerwise run` (FLOW_RUN) tracking into `experiment`, started training in `project`
    (with `temporary` as its TMPDIR when given)."""
    launcher = subprocess.Popen(
        [str(LAYERWISE), *FLOW_RUN, "--set", f"name={experiment}"], cwd=project,
        preexec_fn=as_from_a_terminal,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, track.TRACKING_VARIABLE: f"sqlite:///{project / 'mlflow.db'}",
             **({"TMPDIR": str(temporary)} if temporary is not None else {})})
    _wait_for(lambda: processes_mentioning("layerwise.strategies.runtime.worker", project)
              or launcher.poll() is not None, "the one-process reference to start training")
    assert launcher.poll() is None
    return launcher


def _parent_run(project: Path, experiment: str) -> tuple[MlflowClient, str, Any]:
    """The project's MLflow client, the experiment's id and its one (parent) run."""
    client = MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
    found = client.get_experiment_by_name(experiment)
    assert found is not None
    [parent] = client.search_runs([found.experiment_id])
    return client, found.experiment_id, parent


def _stop_leftovers(launcher: subprocess.Popen[bytes], project: Path) -> None:
    if launcher.poll() is None:
        launcher.kill()
    for pid in processes_mentioning("", project):
        os.kill(pid, signal.SIGKILL)


# The next command's cleanup of Prefect's records, in the project's environment, between two
# reads of the state types of every flow run and task run the killed flow left in its owner's
# name (all of them, whatever the state: a run the cleanup missed shows as RUNNING after)
PREFECT_CLEANUP = """
import json, sys
from layerwise.flows.cli.run import start_local_api, use_embedded_environment
use_embedded_environment()
start_local_api()
from prefect import get_client
from layerwise.flows.flow_runs import crash_orphaned_flow_runs

def states():
    with get_client(sync_client=True) as client:
        flows = [run for run in client.read_flow_runs()
                 if f"owner_pid:{sys.argv[1]}" in run.tags]
        tasks = [task for flow in flows for task in client.read_task_runs()
                 if task.flow_run_id == flow.id]
    return {"flows": [run.state_type.value for run in flows],
            "tasks": [task.state_type.value for task in tasks]}

before = states()
crashed = crash_orphaned_flow_runs()
print(json.dumps([before, {**states(), "crashed": len(crashed)}]))
"""


def _prefect_states_around_cleanup(project: Path, owner_pid: int) -> list[dict[str, Any]]:
    finished = subprocess.run([sys.executable, "-c", PREFECT_CLEANUP, str(owner_pid)],
                              cwd=project, capture_output=True, text=True, check=True,
                              timeout=WAIT_SECONDS)
    return json.loads(finished.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the workers in /proc")
def test_ctrl_c_on_the_benchmark_flow_stops_its_workers_and_marks_the_run_killed(flow_project):
    launcher = _start_flow(flow_project, "interrupted")
    try:
        launcher.send_signal(signal.SIGINT)
        launcher.wait(WAIT_SECONDS)
        assert launcher.returncode != 0
        _wait_for(lambda: not processes_mentioning("", flow_project), "every process to stop")
    finally:
        _stop_leftovers(launcher, flow_project)
    _, _, parent = _parent_run(flow_project, "interrupted")
    assert parent.info.status == "KILLED"


# A process that starts one command inside `guarding_what_starts` and one after, says their
# pids, and is killed (SIGKILL: no handler runs) the moment the first has started
KILLED_RIGHT_AFTER_A_START = """
import os, signal, subprocess
from layerwise.strategies.jobs.tether import guarding_what_starts
quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
with guarding_what_starts():
    inside = subprocess.Popen(["sleep", "600"], **quiet)
after = subprocess.Popen(["sleep", "600"], **quiet)
print(inside.pid, after.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="guards by /proc")
def test_a_process_started_under_a_guard_stops_even_when_its_starter_dies_at_once():
    """The guard starts before what it guards: a starter killed the moment its command has
    started leaves nothing running that it started inside the block, and stops nothing it
    started outside it."""
    starter = subprocess.run([sys.executable, "-c", KILLED_RIGHT_AFTER_A_START],
                             capture_output=True, text=True, timeout=WAIT_SECONDS)
    assert starter.returncode == -signal.SIGKILL, starter.stderr
    inside, after = map(int, starter.stdout.split())
    try:
        _wait_for(lambda: not _running(inside), "the guarded process to stop", STOP_SECONDS)
        assert _running(after)
    finally:
        for pid in (inside, after):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the processes in /proc")
def test_a_killed_benchmark_flow_leaves_no_process_and_the_next_marks_its_run_killed(
        flow_project, tmp_path):
    """SIGKILL runs no handler: Prefect's server, torchrun and its workers go because they are
    tied to the flow's process (layerwise.strategies.jobs.tether); the Prefect flow and task runs it
    left Running are marked Crashed by the next command's start (crash_orphaned_flow_runs), and
    the MLflow run it left RUNNING is marked KILLED by the next flow's start
    (close_orphaned_runs), as their writer is gone."""
    temporary = _private_temporary_folder(tmp_path)
    launcher = _start_flow(flow_project, "killed", temporary)
    try:
        assert processes_mentioning("prefect.server.api.server:create_app", flow_project)
        launcher.kill()
        launcher.wait(WAIT_SECONDS)
        _wait_for(lambda: not processes_mentioning("", flow_project), "every process to stop",
                  STOP_SECONDS)
        _wait_for_no_leftovers(temporary)
    finally:
        _stop_leftovers(launcher, flow_project)
    before, after = _prefect_states_around_cleanup(flow_project, launcher.pid)
    assert "RUNNING" in before["flows"] and "RUNNING" in before["tasks"]
    assert "RUNNING" not in after["flows"] + after["tasks"], after
    assert after["crashed"] == 1
    client, experiment_id, parent = _parent_run(flow_project, "killed")
    assert parent.info.status == "RUNNING"
    assert parent.data.tags[owner.OWNER_PID] == str(launcher.pid)
    assert track.close_orphaned_runs(client, experiment_id) == [parent.info.run_id]
    closed = client.get_run(parent.info.run_id)
    assert closed.info.status == "KILLED"
    assert f"pid {launcher.pid}" in closed.data.tags[track.ORPHAN_TAG]


def test_a_flow_start_closes_only_the_runs_whose_writer_is_gone(tmp_path):
    """Owner tags name the writing process by host, pid and start: a run whose writer is gone
    (no such pid, or the pid now another process's) is marked KILLED; a live writer's run, one
    of another host or without owner tags (whose writer cannot be told) stays as it is."""
    alive = owner.owner_tags()
    never_a_pid = str(2**22 + 1)  # above Linux's largest pid_max
    cases = {  # run name: (tags, status it is left in, status expected after)
        "writer gone": ({**alive, owner.OWNER_PID: never_a_pid}, None, "KILLED"),
        "pid reused": ({**alive, owner.OWNER_STARTED: "0.00"}, None, "KILLED"),
        "writer alive": (alive, None, "RUNNING"),
        "another host": ({**alive, owner.OWNER_HOST: "elsewhere",
                          owner.OWNER_PID: never_a_pid}, None, "RUNNING"),
        "no owner": ({}, None, "RUNNING"),
        "unreadable owner": ({**alive, owner.OWNER_PID: "x"}, None, "RUNNING"),
        "finished": ({**alive, owner.OWNER_PID: never_a_pid}, "FINISHED", "FINISHED"),
    }
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment_id = client.create_experiment("orphans")
    ids = {}
    for name, (tags, status, _) in cases.items():
        ids[name] = client.create_run(experiment_id, run_name=name, tags=tags).info.run_id
        if status is not None:
            client.set_terminated(ids[name], status)
    closed = track.close_orphaned_runs(client, experiment_id)
    assert sorted(closed) == sorted(ids[name] for name in ("writer gone", "pid reused"))
    for name, (_, _, expected) in cases.items():
        run = client.get_run(ids[name])
        assert run.info.status == expected, name
        assert (track.ORPHAN_TAG in run.data.tags) == (expected == "KILLED"), name


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the processes in /proc")
@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_a_stopped_concurrent_profile_leaves_no_process(tmp_path, stop):
    """The concurrent profilers are spawned by Python's multiprocessing, which stops none of
    them when their parent is killed outright, and waits for them at exit after a handled
    SIGTERM; Python's default SIGTERM left their semaphores to the resource tracker's warning.
    (The calibration ranks are started and stopped the same way, but a whole calibration ends
    in less time than this test would wait for them.)"""
    command = ("profile", "vgg16", "--devices", "4", "--processes", "2", "--image-size", "64",
               "--batch-per-device", "8", "--out", "profile.json")
    temporary = _private_temporary_folder(tmp_path)
    launcher = subprocess.Popen([str(LAYERWISE), *command], cwd=tmp_path,
                                preexec_fn=as_from_a_terminal,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "TMPDIR": str(temporary)})
    cli, started = psutil.Process(launcher.pid), []
    try:
        # two profilers and Python's resource tracker
        _wait_for(lambda: len(_multiprocessing_children(cli)) >= 3
                  or launcher.poll() is not None, "the measuring processes to start")
        assert launcher.poll() is None
        started = _multiprocessing_children(cli)
        launcher.send_signal(stop)
        _, stderr = launcher.communicate(timeout=STOP_SECONDS)
        _, alive = psutil.wait_procs(started, timeout=STOP_SECONDS)
        assert not alive, [process.cmdline() for process in alive]
        _wait_for_no_leftovers(temporary)
        assert "Traceback" not in stderr, stderr
        if stop == signal.SIGTERM:  # after a SIGKILL only the tracker can clean them, and says so
            assert "leaked" not in stderr, stderr
    finally:
        kill_tree(launcher)
        for process in started:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()


def _multiprocessing_children(process: psutil.Process) -> list[psutil.Process]:
    found = []
    for child in process.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if "multiprocessing" in " ".join(child.cmdline()):
                found.append(child)
    return found


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_a_run_stopped_while_its_prefect_server_starts_leaves_no_listener(flow_project, stop):
    """`timeout` sends SIGTERM, often in the seconds Prefect's server takes to start: the guard
    is armed before the server's process exists, not when it first answers."""
    server = "prefect.server.api.server:create_app"
    launcher = subprocess.Popen(
        [str(LAYERWISE), *FLOW_RUN, "--set", "name=stopped-at-start"], cwd=flow_project,
        preexec_fn=as_from_a_terminal, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ,
             track.TRACKING_VARIABLE: f"sqlite:///{flow_project / 'mlflow.db'}"})
    try:
        _wait_for(lambda: processes_mentioning(server, flow_project)
                  or launcher.poll() is not None, "Prefect's server process to start")
        launcher.send_signal(stop)
        launcher.wait(WAIT_SECONDS)
        _wait_for(lambda: not processes_mentioning(server, flow_project),
                  "the server to be stopped with its run")
    finally:
        _stop_leftovers(launcher, flow_project)
