"""`layerwise init`: a project folder where an installed layerwise runs its benchmark.

    layerwise init                  # the current folder
    layerwise init my-benchmarks    # a new or empty folder
    layerwise init --force          # overwrite the files it writes

Writes params.yaml (the data stages' parameters), dvc.yaml (those stages), configs/benchmark.yaml
(the benchmark `layerwise run` runs, to edit), prefect.yaml (the nightly deployment for work
pools) and .gitignore (what runs write: data, MLflow's store, run folders), all or none, so that
`pip install layerwise && layerwise init && layerwise run` works in an empty folder as `make run`
does in a checkout. A file already there is kept unless --force says otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from layerwise.flows.cli.console import console, user_errors
from layerwise.flows.project_files import project_texts
from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.files.atomic import write_atomic_together


def register(app: typer.Typer) -> None:
    """Add `init` to the CLI."""
    app.command("init")(init)


@user_errors
def init(
    folder: Annotated[Path, typer.Argument(
        help="The project folder (made when missing).")] = Path("."),
    force: Annotated[bool, typer.Option(
        help="Overwrite files of the same names.")] = False,
) -> None:
    """Write a layerwise project (config, data stages, deployment) into FOLDER."""
    if folder.exists() and not folder.is_dir():
        raise LayerwiseError(f"{folder} is a file, not a folder; name a folder to write the "
                             "project into")
    texts = {folder / name: text for name, text in project_texts().items()}
    present = [str(path) for path in texts if path.exists()]
    if present and not force:
        raise LayerwiseError(f"{', '.join(present)} already there; nothing written (--force "
                             "overwrites them)")
    write_atomic_together(texts)
    console.print(f"wrote {', '.join(str(path) for path in texts)}")
    where = "" if folder.resolve() == Path.cwd().resolve() else f"cd {folder} && "
    console.print(f"next: {where}layerwise run   (the benchmark on embedded defaults; "
                  "configs/benchmark.yaml to change it)", highlight=False)
