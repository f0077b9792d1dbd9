"""A disk that fills up: one line saying so, and no file half there.

Each case runs in a mount namespace of its own (`unshare --mount`) on a tmpfs a few pages
large, so a full disk is real (ENOSPC from the kernel) and this machine's mounts are untouched.
Where namespaces or tmpfs are not allowed (no privileges), the cases are skipped as impossible.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

LAYERWISE = Path(sys.executable).parent / "layerwise"
WAIT_SECONDS = 300  # a few training steps take ~15 s; reached only on a hang


def _on_full_disk(folder: Path, size: str, command: list[str]) -> subprocess.CompletedProcess:
    """`command` with a `size` tmpfs mounted on `folder`, seen by it alone."""
    folder.mkdir()
    script = 'mount -t tmpfs -o size="$1" tmpfs "$2" && shift 2 && exec "$@"'
    return subprocess.run(["unshare", "--mount", "sh", "-c", script, "sh", size, str(folder),
                           *command], capture_output=True, text=True, timeout=WAIT_SECONDS)


def _mountable(tmp_path: Path) -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = _on_full_disk(tmp_path / "probe", "4k", ["true"])
    return probe.returncode == 0


@pytest.fixture
def full_disk(tmp_path):
    if not _mountable(tmp_path):
        pytest.skip("needs a mount namespace and tmpfs (unshare --mount as root)")
    return tmp_path / "disk"


def test_a_checkpoint_on_a_full_disk_is_one_line_naming_it(full_disk):
    """The rank that hits it cannot write its error file either: it tells the launcher."""
    run = full_disk / "run"
    finished = _on_full_disk(full_disk, "200k", [
        str(LAYERWISE), "train", "lenet5", "--strategy", "data", "--nproc", "2",
        "--image-size", "16", "--steps", "3", "--checkpoint-every", "1", "--out", str(run)])
    lines = [line for line in finished.stderr.splitlines() if line.strip()]
    assert finished.returncode == 1 and len(lines) == 1, finished.stderr
    assert (f"rank 0 failed first: FailedError: cannot write {run / 'checkpoint.pt'}: No "
            "space left on device") in lines[0], lines[0]


CALIBRATION = """
import sys
from layerwise.strategies.hardware.calibrate import Calibration, CalibrationPoint, save_calibration
points = [CalibrationPoint(kind=kind, bytes=4 ** i, seconds=1e-3 * (1 + i))
          for kind in ("p2p", "allreduce") for i in range(12)]
calibration = Calibration(backend="gloo", nproc=2, host="vm", torch_version="2", points=points,
                          p2p_latency=1e-3, p2p_bandwidth=5e8, allreduce_latency=1e-3,
                          allreduce_bandwidth=4e8, created="2026-01-01T00:00:00+00:00")
try:
    save_calibration(calibration, sys.argv[1])
finally:
    import os
    print(sorted(os.listdir(os.path.dirname(sys.argv[1]))))
"""


def test_a_calibration_on_a_full_disk_leaves_neither_file(full_disk):
    """The cluster file fits, the measurements do not: a cluster without its measurements
    was left behind."""
    finished = _on_full_disk(full_disk, "4k", [sys.executable, "-c", CALIBRATION,
                                               str(full_disk / "c.yaml")])
    assert finished.returncode == 1
    assert "cannot write" in finished.stderr and "No space left on device" in finished.stderr
    assert finished.stdout.strip() == "[]", finished.stdout
