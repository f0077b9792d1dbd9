"""Huge pages for large CPU tensors: on by default where the kernel offers them, the user's
setting kept, and really taken by torch in a process started with the launcher's environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from layerwise.flows.cli import app
from layerwise.strategies.processes.huge_pages import (
    HUGE_PAGES_VARIABLE,
    kernel_offers_huge_pages,
    with_huge_pages,
)
from layerwise.strategies.training_run import RunResult

KERNEL_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")

# A 64 MB tensor, written, then the process's anonymous memory on huge pages (kB).
HUGE_KB = """
import torch
weights = torch.ones(16 * 1024 * 1024)
rollup = open('/proc/self/smaps_rollup').read().splitlines()
print(next(int(line.split()[1]) for line in rollup if line.startswith('AnonHugePages:')))
"""


@pytest.mark.parametrize(("text", "offers"), [
    ("always [madvise] never\n", True), ("[always] madvise never\n", True),
    ("always madvise [never]\n", False)])
def test_the_kernel_mode_decides(tmp_path, text: str, offers: bool) -> None:
    setting = tmp_path / "enabled"
    setting.write_text(text)
    assert kernel_offers_huge_pages(setting) is offers
    assert kernel_offers_huge_pages(tmp_path / "missing") is False


def test_the_users_setting_wins() -> None:
    assert with_huge_pages({HUGE_PAGES_VARIABLE: "0", "A": "b"}) == {
        HUGE_PAGES_VARIABLE: "0", "A": "b"}
    added = with_huge_pages({"A": "b"})
    assert added["A"] == "b"
    assert added.get(HUGE_PAGES_VARIABLE) == ("1" if kernel_offers_huge_pages() else None)


def _huge_kb(environment: dict[str, str]) -> int:
    finished = subprocess.run([sys.executable, "-c", HUGE_KB], env=environment,
                              capture_output=True, text=True, check=True)
    return int(finished.stdout)


@pytest.mark.skipif(not kernel_offers_huge_pages(), reason="the kernel offers no huge pages")
def test_a_started_process_puts_its_large_tensors_on_huge_pages() -> None:
    plain = {key: value for key, value in os.environ.items() if key != HUGE_PAGES_VARIABLE}
    # 62 MB of the 64 here; at least one 2 MB page wherever the kernel has one free to give
    assert _huge_kb(with_huge_pages(plain)) >= 2048
    if "[madvise]" in KERNEL_SETTING.read_text():  # only asked-for memory gets them
        assert _huge_kb({**plain, HUGE_PAGES_VARIABLE: "0"}) == 0


@pytest.mark.slow
@pytest.mark.skipif(not kernel_offers_huge_pages(), reason="the kernel offers no huge pages")
def test_the_launcher_gives_its_workers_huge_pages_and_the_run_says_so(tmp_path,
                                                                      monkeypatch) -> None:
    """Called as a library (no CLI main has set it), the launcher still turns them on for its
    workers, and the run's result records it (a user's 0 keeps them off: with_huge_pages and
    the process test above)."""
    monkeypatch.delenv(HUGE_PAGES_VARIABLE, raising=False)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "train", "tiny_cnn", "--strategy", "data", "--nproc", "2", "--image-size", "8",
        "--batch-per-device", "4", "--steps", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert HUGE_PAGES_VARIABLE not in os.environ  # the launcher's own environment is untouched
    assert RunResult.load(out / "result.json").huge_pages is True
