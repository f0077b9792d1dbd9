"""The benchmark's data stage: a DVC data stage (`prepare`, `prepare_fields`), run as a
Prefect task, its output pushed to the project's DVC remote.

`dvc repro STAGE` rebuilds data/prepared/<dataset> only when params.yaml's section of that stage
or tasks/stages/prepare_data.py changed (about 2 s to find nothing to do) and records the
output's hash in dvc.lock, which the tracking task tags every MLflow run with. Outside a DVC
project the same stage runs directly from params.yaml.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.files.locations import PREPARED_DIR
from layerwise.strategies.runtime.datasets import GENERATED_DATASETS, ImageSpec, prepared_spec
from layerwise.tasks.stages.prepare_data import PARAMS_FILE, prepare, settings_from, stage_sections


@task(name="prepare data", cache_policy=NO_CACHE)
def prepare_data(dataset: str, push: bool = True) -> ImageSpec | None:
    """Prepare `dataset` and return what it fixes about the model's input (None for the
    generated ones, synthetic and segments, which fit any model).

    A dataset one of params.yaml's data sections names (`prepare`, `prepare_fields`: each the
    parameters of the DVC stage of that name) is rebuilt through DVC when it changed (directly
    outside a DVC project) and, with `push`, pushed to the project's DVC remote, so that another
    clone's `dvc pull` finds what this run trained on; another prepared dataset is used as it
    is (its error says how to prepare it).
    """
    if dataset in GENERATED_DATASETS:
        return None
    for stage, section in stage_sections(PARAMS_FILE).items():
        settings = settings_from(section)
        if settings.dataset == dataset:
            if Path(".dvc").is_dir():
                _dvc("repro", stage)
                if push:
                    _dvc("push", stage)
            else:
                prepare(settings)
            break
    return prepared_spec(dataset, PREPARED_DIR)


def _dvc(command: str, stage: str) -> None:
    """`dvc COMMAND STAGE` with this interpreter first on PATH (a stage runs `python`); its
    output in the task's log, its last error line raised."""
    logger = get_run_logger()
    environment = {**os.environ,
                   "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    finished = subprocess.run([sys.executable, "-m", "dvc", command, stage],
                              capture_output=True, text=True, env=environment, check=False)
    for line in finished.stdout.splitlines():
        if line.strip():
            logger.info("dvc: %s", line)
    if finished.returncode != 0:
        last = next((line for line in reversed(finished.stderr.splitlines()) if line.strip()),
                    f"exit code {finished.returncode}")
        hint = (" (set dvc_push: false to keep the data local, or `dvc remote add -d` a "
                "remote)" if command == "push" else "")
        raise LayerwiseError(f"`dvc {command} {stage}` failed: {last.strip()}{hint}")
