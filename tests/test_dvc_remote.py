"""The project's DVC remote: `dvc push` from one clone, `dvc pull` into a second.

A temporary git repo gets the project's dvc.yaml, the prepare stage and its .dvc/config, whose
default remote is a per-user folder outside every clone (`~/.cache/layerwise/dvc-remote`; HOME
points into the test's folder here), so this checks the configuration a user gets, not one
written for the test.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.dvc_repo import ROOT, data_repo, dvc, run


def tree_bytes(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes()
            for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.mark.slow
def test_a_second_clone_pulls_what_the_first_pushed_and_stays_clean(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    repo = data_repo(tmp_path)
    shutil.copy(ROOT / ".dvc" / "config", repo / ".dvc" / "config")
    dvc("repro", "prepare", cwd=repo)
    before = tree_bytes(repo / "data" / "prepared" / "digits")
    assert {"train.npz", "val.npz", "meta.json"} <= set(before)
    run(["git", "add", "-A"], repo)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "data"], repo)

    dvc("push", cwd=repo)
    remote = home / ".cache" / "layerwise" / "dvc-remote"
    assert any(path.is_file() for path in remote.rglob("*"))
    assert not (repo / "dvc-remote").exists()

    second = tmp_path / "second"
    run(["git", "clone", "-q", str(repo), str(second)], tmp_path)
    dvc("pull", "prepare", cwd=second)  # the stage the first clone pushed
    assert tree_bytes(second / "data" / "prepared" / "digits") == before
    dvc("repro", "prepare", cwd=second)  # the first run of the clone: nothing to rebuild
    assert run(["git", "status", "--porcelain"], second).stdout == ""
