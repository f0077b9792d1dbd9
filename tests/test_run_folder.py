"""Run folders claimed atomically: launches a moment apart never share one, a live run's folder
is refused to `--resume`, and a claim dies with its process, even by SIGKILL.

Threads stand in for launches racing (the claim is decided by the filesystem and the kernel's
flock, which do not care whether two claimants share a process); `layerwise train` runs in
process with CliRunner while the test holds a claim; one subprocess holds a claim and is killed.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from layerwise.flows.cli import app
from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.files.locations import LOCK_FILE, SETTINGS_FILE
from layerwise.strategies.jobs.job import new_job
from layerwise.strategies.jobs.launch import write_run_folder
from layerwise.strategies.jobs.options import TrainOptions
from layerwise.strategies.jobs.run_folder import (
    FolderClaim,
    claim_existing_run,
    claim_new_folder,
    claim_stamped_folder,
)
from tests.test_owt import one_line_error

RACERS = 8
WAIT_SECONDS = 60.0  # far above a claim's milliseconds: reached only on a hang
TINY = ("tiny_cnn", "--nproc", "2", "--image-size", "8", "--batch-per-device", "4")
runner = CliRunner()


def _race(claim) -> tuple[list[FolderClaim], list[str]]:
    """`claim()` from RACERS threads released at once: the claims won and the errors."""
    barrier, won, refused = threading.Barrier(RACERS, timeout=WAIT_SECONDS), [], []

    def racer() -> None:
        barrier.wait()
        try:
            won.append(claim())
        except LayerwiseError as error:
            refused.append(str(error))

    threads = [threading.Thread(target=racer) for _ in range(RACERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_SECONDS)
        assert not thread.is_alive(), "a racer is still waiting"
    return won, refused


def test_launches_into_one_folder_at_once_leave_it_to_exactly_one(tmp_path):
    out = tmp_path / "run"
    won, refused = _race(lambda: claim_new_folder(out))
    assert len(won) == 1 and len(refused) == RACERS - 1, refused
    assert all(f"--out {out}" in line and "\n" not in line for line in refused)
    won[0].release()
    assert not out.exists() or not any(out.iterdir())  # no run started: no lock left behind


def test_auto_named_folders_of_the_same_second_differ(tmp_path):
    won, refused = _race(lambda: claim_stamped_folder(tmp_path / "runs", "tiny_cnn-data"))
    assert not refused
    folders = {claim.path for claim in won}
    assert len(folders) == RACERS and all(folder.is_dir() for folder in folders)
    for claim in won:
        claim.release()


def test_a_folder_a_live_run_holds_is_refused_to_a_new_run_and_to_resume(tmp_path):
    out = tmp_path / "run"
    options = TrainOptions(nproc=2, image_size=8, batch_per_device=4)
    with new_job("tiny_cnn", "data", options, out, analytic=True) as job:
        refused = runner.invoke(app, ["train", *TINY, "--strategy", "data", "--out", str(out)])
        one_line_error(refused, f"--out {out} is in use by a live run (pid ")
        write_run_folder(job)  # the live run's files, as the launcher writes them
        before = {path.name: path.read_bytes() for path in out.iterdir()}
        resumed = runner.invoke(app, ["train", "tiny_cnn", "--resume", str(out), "--steps", "5"])
        one_line_error(resumed, f"--resume {out} is in use by a live run (pid ",
                        "wait for it to end")
        assert {path.name: path.read_bytes() for path in out.iterdir()} == before
    with claim_existing_run(out):  # released with the job: a later launch may continue it
        pass
    fresh = runner.invoke(app, ["train", *TINY, "--strategy", "data", "--out", str(out)])
    one_line_error(fresh, f"--out {out} already holds files", f"--resume {out}")


def test_a_claim_goes_with_its_process_even_when_killed(tmp_path):
    out = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         "from pathlib import Path\n"
         "from layerwise.strategies.jobs.run_folder import claim_new_folder\n"
         "claim_new_folder(Path(sys.argv[1]))\n"
         "print('held', flush=True)\n"
         "time.sleep(600)\n", str(out)],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(LayerwiseError, match=rf"pid {holder.pid}\)"):
            claim_existing_run(out)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    (out / "train.json").write_text("{}")  # as a run killed before its first step leaves it
    with claim_existing_run(out) as claim:
        assert claim.path == out
    assert (out / LOCK_FILE).is_file()  # the lock file of a folder with a run stays


def test_a_planted_lock_link_is_refused_and_its_target_left_alone(tmp_path):
    out, target = tmp_path / "run", tmp_path / "victim.txt"
    out.mkdir()
    (out / SETTINGS_FILE).write_text("{}")  # a run folder, as --resume expects
    target.write_text("kept\n")
    (out / LOCK_FILE).symlink_to(target)
    with pytest.raises(LayerwiseError, match="is a symbolic link; remove it"):
        claim_existing_run(out)
    assert target.read_text() == "kept\n"
