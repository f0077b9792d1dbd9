"""Temporary folders go with the process that made them, however it ends: a launch's stores,
the profilers' results, a verify's reference weights."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.files.atomic import write_atomic
from layerwise.strategies.processes.owned_folder import SUPPORTED, owned_folder

WAIT_SECONDS = 30  # far above what removing a folder takes; reached only on a failure

MAKER = """
import sys, time
from layerwise.strategies.processes.owned_folder import owned_folder
with owned_folder("layerwise-test-", sys.argv[1]) as folder:
    (folder / "weights.pt").write_bytes(b"x" * 1000)
    print(folder, flush=True)
    time.sleep(600)
"""


def _gone(path: Path) -> bool:
    deadline = time.monotonic() + WAIT_SECONDS
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return not path.exists()


def test_the_folder_is_private_and_gone_after_its_block(tmp_path):
    with owned_folder("layerwise-test-", tmp_path) as folder:
        (folder / "points.json").write_text("[]")
        assert folder.parent == tmp_path and folder.stat().st_mode & 0o777 == 0o700
    assert not folder.exists() and not list(tmp_path.iterdir())


@pytest.mark.skipif(not SUPPORTED, reason="the sweeper waits on a pidfd (Linux)")
@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_a_killed_maker_leaves_no_folder(tmp_path, stop):
    maker = subprocess.Popen([sys.executable, "-c", MAKER, str(tmp_path)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert maker.stdout is not None
        folder = Path(maker.stdout.readline().strip())
        assert (folder / "weights.pt").is_file()
        maker.send_signal(stop)  # no handler runs: only the sweeper can remove it
        maker.wait(WAIT_SECONDS)
        assert _gone(folder), list(folder.iterdir())
    finally:
        maker.kill()
        maker.wait()


def test_a_worker_never_makes_its_launchers_folder_again(tmp_path):
    gone = tmp_path / "layerwise-calibrate-x"
    with pytest.raises(LayerwiseError, match="No such file or directory"):
        write_atomic(gone / "points.json", "[]", make_folder=False)
    assert not gone.exists()
