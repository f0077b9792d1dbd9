"""The project's DVC remote: `dvc push` and `dvc pull` through the shipped .dvc/config.

A temporary git repo gets the project's dvc.yaml, the prepare stage and its .dvc/config, whose
default remote is a folder inside the project (`url = ../dvc-remote`, relative to .dvc/), so
this checks the configuration a user gets, not one written for the test.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.dvc_repo import ROOT, data_repo, dvc


def tree_bytes(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes()
            for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.mark.slow
def test_push_then_pull_restores_the_prepared_data_byte_for_byte(tmp_path):
    repo = data_repo(tmp_path)
    shutil.copy(ROOT / ".dvc" / "config", repo / ".dvc" / "config")
    dvc("repro", "prepare", cwd=repo)
    prepared = repo / "data" / "prepared" / "digits"
    before = tree_bytes(prepared)
    assert {"train.npz", "val.npz", "meta.json"} <= set(before)

    dvc("push", cwd=repo)
    remote = repo / "dvc-remote"
    assert any(path.is_file() for path in remote.rglob("*"))
    shutil.rmtree(prepared)
    shutil.rmtree(repo / ".dvc" / "cache")  # so pull must fetch from the remote
    dvc("pull", cwd=repo)
    assert tree_bytes(prepared) == before
