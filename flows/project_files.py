"""The files of a layerwise project, for `layerwise init`: the checkout's own params.yaml,
dvc.yaml, configs/*.yaml, prefect.yaml and .gitignore, adapted to a folder that holds none of
layerwise's code.

An installed package carries them in layerwise/project/ (setup.py copies them there when it
builds); an editable checkout reads them at its root. Two adaptations: dvc.yaml's stages depend
on tasks/stages/*.py, which only a checkout has (in a project the installed package's code runs
them, and a stage reruns when its parameters change), and prefect.yaml's entrypoint is the
installed flow's module path instead of the checkout's file.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

import yaml

from layerwise.strategies.errors import LayerwiseError

PROJECT_FILES = ("params.yaml", "dvc.yaml", "prefect.yaml", ".gitignore")  # and configs/*.yaml
CONFIGS = "configs"
CHECKOUT_ENTRYPOINT = "entrypoint: flows/benchmark.py:benchmark"
INSTALLED_ENTRYPOINT = "entrypoint: layerwise.flows.benchmark:benchmark"
DVC_HEADER = ("# The data stages of params.yaml (`dvc repro`), run by the installed layerwise;\n"
              "# `layerwise init` wrote this file from layerwise's own.\n")


def project_texts() -> dict[str, str]:
    """Every project file's text, adapted to a project folder (see the module docstring)."""
    texts = {name: _source(name) for name in (*PROJECT_FILES, *_config_names())}
    if CHECKOUT_ENTRYPOINT not in texts["prefect.yaml"]:
        raise LayerwiseError(f"prefect.yaml of this layerwise has no '{CHECKOUT_ENTRYPOINT}' "
                             "line to adapt; reinstall layerwise")
    texts["prefect.yaml"] = texts["prefect.yaml"].replace(CHECKOUT_ENTRYPOINT,
                                                          INSTALLED_ENTRYPOINT)
    texts["dvc.yaml"] = _without_code_dependencies(texts["dvc.yaml"])
    return texts


def _config_names() -> list[str]:
    """configs/<name>.yaml of every benchmark config this layerwise ships (or its checkout
    holds), configs/benchmark.yaml among them."""
    shipped = files("layerwise") / "project" / CONFIGS
    folder = shipped if shipped.is_dir() else _checkout() / CONFIGS
    names = sorted(f"{CONFIGS}/{entry.name}" for entry in folder.iterdir()
                   if entry.name.endswith(".yaml"))
    if f"{CONFIGS}/benchmark.yaml" not in names:
        raise LayerwiseError(f"this layerwise carries no {CONFIGS}/benchmark.yaml to write "
                             f"(looked in {folder}); reinstall it with `pip install layerwise`")
    return names


def _checkout() -> Path:
    """The checkout's root, where an editable install reads its project files."""
    return Path(str(files("layerwise"))).resolve().parent


def _source(name: str) -> str:
    """A project file as this layerwise ships it, or as its checkout holds it."""
    shipped = files("layerwise") / "project" / name
    if shipped.is_file():
        return shipped.read_text(encoding="utf-8")
    checkout = _checkout() / name
    if checkout.is_file():
        return checkout.read_text(encoding="utf-8")
    raise LayerwiseError(f"this layerwise carries no {name} to write (looked in "
                         f"{shipped} and {checkout}); reinstall it with `pip install layerwise`")


def _without_code_dependencies(text: str) -> str:
    """dvc.yaml with the stages' `deps` on layerwise's source files dropped."""
    document = yaml.safe_load(text)
    for stage in document.get("stages", {}).values():
        stage.pop("deps", None)
    return DVC_HEADER + yaml.safe_dump(document, sort_keys=False, width=200)
