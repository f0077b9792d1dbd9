"""The build's one computed part: the repository's top-level folders `strategies/`, `tasks/`
and `flows/` install as subpackages of the one namespace `layerwise`, so that a user's own
packages of those common names can never shadow them (everything else is in pyproject.toml).

    pip install .        # or `make install` for the editable checkout
"""

from setuptools import find_packages, setup

MAPPED_FOLDERS = ("strategies", "tasks", "flows")

setup(
    package_dir={"layerwise": "layerwise",
                 **{f"layerwise.{folder}": folder for folder in MAPPED_FOLDERS}},
    packages=["layerwise", *(f"layerwise.{package}" for package in
                             find_packages(include=[f"{folder}*" for folder in MAPPED_FOLDERS]))],
)
