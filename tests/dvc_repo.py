"""A temporary git + DVC repo holding the project's `prepare` stage, for the DVC tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
STAGE_SCRIPT = Path("tasks", "stages", "prepare_data.py")  # the prepare stage's dependency


def run(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a command with this interpreter's bin first on PATH (the stage runs `python`)."""
    env = {**os.environ, "DVC_NO_ANALYTICS": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=True)


def dvc(*arguments: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run([str(Path(sys.executable).parent / "dvc"), *arguments], cwd)


def data_repo(tmp_path: Path, image_size: int = 8) -> Path:
    """A fresh git repo with dvc.yaml, the prepare stage and params.yaml at `image_size`."""
    repo = tmp_path / "repo"
    (repo / "tasks" / "stages").mkdir(parents=True)
    shutil.copy(ROOT / "dvc.yaml", repo)
    shutil.copy(ROOT / STAGE_SCRIPT, repo / STAGE_SCRIPT)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["prepare"]["image_size"] = image_size
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    run(["git", "init", "-q"], repo)
    dvc("init", "-q", cwd=repo)
    return repo
