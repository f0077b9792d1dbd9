"""The build's computed parts: the repository's top-level folders `strategies/`, `tasks/` and
`flows/` install as subpackages of the one namespace `layerwise`, so that a user's own packages
of those common names can never shadow them; and the checkout's project files (params.yaml,
dvc.yaml, prefect.yaml, .gitignore, configs/*.yaml) ship in layerwise/project/, which
`layerwise init` writes into a new project (everything else is in pyproject.toml).

    pip install .        # or `make install` for the editable checkout
"""

import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

MAPPED_FOLDERS = ("strategies", "tasks", "flows")
PROJECT_FILES = ("params.yaml", "dvc.yaml", "prefect.yaml", ".gitignore",
                 *sorted(str(path) for path in Path("configs").glob("*.yaml")))


class BuildWithProjectFiles(build_py):
    """build_py, and the project files copied into the built package's project/ folder."""

    def run(self) -> None:
        super().run()
        for name in PROJECT_FILES:
            target = Path(self.build_lib) / "layerwise" / "project" / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(name, target)


setup(
    package_dir={"layerwise": "layerwise",
                 **{f"layerwise.{folder}": folder for folder in MAPPED_FOLDERS}},
    packages=["layerwise", *(f"layerwise.{package}" for package in
                             find_packages(include=[f"{folder}*" for folder in MAPPED_FOLDERS]))],
    cmdclass={"build_py": BuildWithProjectFiles},
)
