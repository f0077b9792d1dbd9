"""`layerwise verify`: prove a strategy exact against one device, in float64.

    layerwise verify lenet5 --strategy layerwise --nproc 2
    layerwise verify resnet18 --strategy data,owt,spatial_h --nproc 4 --image-size 32
    layerwise verify wide_fc --strategy all --nproc 2 --steps 5 --dataset digits
    layerwise verify mypkg.nets:make_net --strategy net.strategy.json --nproc 2 --json

Each strategy trains K steps in float64 on N torchrun processes (one launch for all of them), then
the plain module trains the same K steps on one process; every loss and every weight is compared
(strategies/exactness/reference.py). Exit code 0 when every strategy exact by design stays within
1e-10, 1 when one does not or a run fails, 2 for bad input. Strategies not exact by design (local
updates, OWT's variable batch, pipelines normalising BatchNorm per micro-batch) report their
divergence.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table
from rich.text import Text

from layerwise.flows.cli.console import (
    GlobalBatch,
    InputShape,
    console,
    input_options,
    print_error,
    user_errors,
)
from layerwise.strategies.jobs.defaults import DEFAULT_BATCH_PER_DEVICE, DEFAULT_VERIFY_STEPS

if TYPE_CHECKING:
    from layerwise.strategies.jobs.exactness_check import VerifyReport

VERIFY_BATCH_PER_DEVICE = 4  # exactness needs no big batch; small ones keep it quick


def register(app: typer.Typer) -> None:
    """Add `verify` to the CLI."""
    app.command("verify")(verify)


@user_errors
def verify(
    model: Annotated[str, typer.Argument(help="Zoo name or package.module:factory.")],
    strategy: Annotated[str, typer.Option(
        help="Strategy names, comma-separated (as `train --strategy` takes them), a strategy "
             "file, or `all` (every strategy that applies).")],
    nproc: Annotated[int, typer.Option(help="Processes.")],
    steps: Annotated[int, typer.Option(help="SGD steps compared.")] = DEFAULT_VERIFY_STEPS,
    dataset: Annotated[str | None, typer.Option(
        help="synthetic (the default), digits or any folder prepared under data/prepared/.")
    ] = None,
    batch_per_device: Annotated[int | None, typer.Option(
        help=f"Samples per process (default {VERIFY_BATCH_PER_DEVICE}; `train` defaults to "
             f"{DEFAULT_BATCH_PER_DEVICE}).")] = None,
    batch: GlobalBatch = None,
    image_size: Annotated[int | None, typer.Option(
        help="Input height and width (default: the dataset's, else the model's).")] = None,
    classes: Annotated[int | None, typer.Option(help="Number of classes.")] = None,
    in_channels: Annotated[int | None, typer.Option(help="Input channels.")] = None,
    input_shape: InputShape = None,
    lr: Annotated[float | None, typer.Option(help="SGD learning rate (default 0.05).")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed (default 0).")] = None,
    cluster: Annotated[str | None, typer.Option(
        help="Cluster preset or YAML the searched strategy is priced on (default local).")
    ] = None,
    out: Annotated[Path | None, typer.Option(
        help="Folder for the float64 runs (default: a new one under runs/).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Train strategies in float64 and compare every loss and weight with one device."""
    image_size, in_channels = input_options(image_size, in_channels, input_shape)
    from layerwise.strategies.jobs.exactness_check import (
        VerifyFailed,
        requested_strategies,
        verify_strategies,
    )
    from layerwise.strategies.jobs.job import claim_folder
    from layerwise.strategies.jobs.options import TrainOptions

    if batch is None and batch_per_device is None:
        batch_per_device = VERIFY_BATCH_PER_DEVICE
    options = TrainOptions.given(nproc=nproc, cluster=cluster, dataset=dataset,
                                 batch_per_device=batch_per_device, batch=batch,
                                 image_size=image_size, classes=classes,
                                 in_channels=in_channels, lr=lr, seed=seed)
    names, every = requested_strategies(strategy)
    title = (f"verifying {len(names)} strateg{'y' if len(names) == 1 else 'ies'} of {model} "
             f"on {nproc} processes in float64")
    with (claim_folder(out, model, "verify") as claim,
          console.status(title, spinner="dots") as status):
        try:
            report = verify_strategies(
                model, names, options, steps, claim.path, skip_inapplicable=every,
                on_progress=lambda name, progress: status.update(
                    f"verifying {name}: step {progress.step}/{progress.steps}"))
        except VerifyFailed as failure:  # a run that failed, as `train` reports one: exit 1
            print_error(str(failure))
            raise typer.Exit(code=1) from None
    if as_json:
        sys.stdout.write(report.model_dump_json(indent=2) + "\n")
    else:
        _print_report(report)
    if report.failed:
        raise typer.Exit(code=1)


def _print_report(report: VerifyReport) -> None:
    table = Table(title=f"{report.model} on {report.nproc} processes, {report.steps} steps in "
                        "float64, against one process", title_justify="left")
    for column in ("strategy", "loss diff", "weight diff", "worst weight", "verdict"):
        table.add_column(column, justify="right" if "diff" in column else "left")
    for divergence in report.divergences:
        verdict = {True: Text("exact", style="green"), False: Text("DIFFERS", style="bold red"),
                   None: Text("inexact by design")}[divergence.exact]
        table.add_row(divergence.strategy, f"{divergence.max_loss_difference:.1e}",
                      f"{divergence.max_parameter_difference:.1e}", divergence.worst_parameter,
                      verdict)
    console.print(table)
    for skipped in report.skipped:
        console.print(f"skipped {skipped.strategy}: {skipped.reason}", highlight=False,
                      soft_wrap=True)
    exact = [d for d in report.divergences if d.exact is not None]
    tolerance = report.divergences[0].tolerance
    if report.failed:
        names = ", ".join(d.strategy for d in report.failed)
        console.print(Text.assemble(("not exact:", "bold red"), f" {names} left one device's "
                                    f"results by more than {tolerance:g} (runs in "
                                    f"{report.folder})"), highlight=False, soft_wrap=True)
    elif exact:
        console.print(f"every exact strategy ({len(exact)}) matches one device within "
                      f"{tolerance:g} (relative, largest over losses and weights)",
                      highlight=False, soft_wrap=True)
