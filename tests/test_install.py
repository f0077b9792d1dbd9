"""What `pip install .` puts in a user's environment: the one import namespace `layerwise`, so
that a user's own `strategies/`, `tasks/` or `flows/` packages never shadow layerwise's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERWISE = Path(sys.executable).parent / "layerwise"
pytestmark = pytest.mark.slow


def _source_copy(folder: Path) -> Path:
    """The files git would clone, copied: setuptools builds inside the source tree, and a
    stale build/ there would end up in the wheel."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, check=True, capture_output=True, text=True).stdout
    for name in listed.splitlines():
        if (ROOT / name).is_file():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, folder / name)
    return folder


def test_the_wheel_installs_one_top_level_name(tmp_path: Path) -> None:
    source = _source_copy(tmp_path / "source")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "--wheel-dir", str(tmp_path), str(source)],
                   check=True, capture_output=True, cwd=tmp_path)
    wheel, = tmp_path.glob("layerwise-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    top_level = {name.split("/")[0] for name in names}
    assert {name for name in top_level if not name.endswith(".dist-info")} == {"layerwise"}
    assert "layerwise/strategies/runtime/worker.py" in names
    assert any(name.endswith("/clusters/p100x16.yaml") for name in names)  # the presets too
    # unpacked where no script folder is on PATH (a GPU machine's own Python): python -m layerwise
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                    str(target), str(wheel)], check=True, capture_output=True)
    shown = subprocess.run([sys.executable, "-m", "layerwise", "clusters", "show", "h200x8"],
                           cwd=tmp_path, capture_output=True, text=True, check=False,
                           env={**os.environ, "PYTHONPATH": str(target)})
    assert shown.returncode == 0, shown.stderr
    assert "H200" in shown.stdout


def test_train_from_a_project_with_packages_of_those_names_runs_and_leaves_no_temp(
        tmp_path: Path) -> None:
    for package in ("strategies", "tasks", "flows"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text(
            f"raise ImportError('the user project\\'s own {package} package was imported')\n")
    temporary = tmp_path / "tmp"  # the launch's TMPDIR: whatever it leaves there stays in sight
    temporary.mkdir()
    result = subprocess.run(
        [str(LAYERWISE), "train", "tiny_cnn", "--strategy", "data", "--nproc", "2",
         "--steps", "1", "--image-size", "8", "--batch-per-device", "2", "--out", "run"],
        cwd=tmp_path, capture_output=True, text=True, timeout=240, check=False,
        env={**os.environ, "TMPDIR": str(temporary)})
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "run" / "result.json").is_file()
    # torch keeps one compile cache per user there (torchinductor_USER), reused, not ours
    left = [path.name for path in temporary.iterdir() if not path.name.startswith("torchinductor")]
    assert left == []  # no torchelastic_* per launch, no layerwise-* folder
