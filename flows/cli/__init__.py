"""The `layerwise` command line: one Typer app, one module per command group.

    layerwise models
    layerwise graph vgg16 --cluster h200x16
    layerwise graph resnet50 --devices 8 --batch 256 --json
    layerwise graph mypkg.nets:make_net --image-size 64 --classes 10
    layerwise clusters
    layerwise clusters show k20x8
    layerwise profile resnet18 --devices 4 --image-size 32
    layerwise calibrate --nproc 2
    layerwise search vgg16 --devices 4 --cluster h200x16 --analytic
    layerwise reproduce optcnn
    layerwise reproduce owt
    layerwise search alexnet --devices 4 --cluster local --analytic --baselines pipeline,paradl
    layerwise oracle resnet50 --platform abci --gpus 4,64,1024
    layerwise train tiny_cnn --strategy data --nproc 2 --steps 50 --image-size 16
    layerwise train resnet18 --strategy layerwise --nproc 4 --image-size 32 --out runs/r18
    layerwise train resnet18 --resume runs/r18 --steps 400
    layerwise train lenet5 --strategy owt_b --nproc 2 --dataset digits --epochs 2
    layerwise verify lenet5 --strategy all --nproc 2
    layerwise run --set steps=80 --set strategies=[data,owt]
    layerwise compare --experiment layerwise-benchmark --json
    layerwise serve --cron "0 2 * * *"
    layerwise init my-benchmarks

Every command takes `--help` (or `-h`); `layerwise --version` names the installed version, and
`layerwise --install-completion` adds tab completion to the user's shell. Bad input (unknown model
or cluster, malformed file, impossible request) prints one line to stderr and exits with code 2.
The commands are thin adapters: the work is in layerwise.strategies.jobs (shared with the Prefect
tasks) and the flows; what is here parses options and draws on the terminal.
"""

from __future__ import annotations

import errno
import os
import sys
from importlib.metadata import version as installed_version
from typing import Annotated

import typer

from layerwise.flows.cli import (
    compare,
    describe,
    init,
    measure,
    oracle,
    plan,
    run,
    serve,
    train,
    verify,
)
from layerwise.flows.cli.console import print_error
from layerwise.strategies.processes.huge_pages import use_huge_pages
from layerwise.strategies.processes.quick_exit import freeze_at_exit

app = typer.Typer(
    help="layerwise: per-layer parallelization of CNN training (Jia et al., ICML 2018).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(asked: bool) -> None:
    if asked:
        print(f"layerwise {installed_version('layerwise')}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True,
        help="Print layerwise's version and exit.")] = False,
) -> None:
    """layerwise: per-layer parallelization of CNN training (Jia et al., ICML 2018)."""


describe.register(app)
measure.register(app)
plan.register(app)
train.register(app)
verify.register(app)
run.register(app)
compare.register(app)
serve.register(app)
oracle.register(app)
init.register(app)


def main() -> None:
    use_huge_pages()  # before anything imports torch (strategies/processes/huge_pages.py)
    freeze_at_exit()  # seconds less at exit (strategies/processes/quick_exit.py)
    if sys.stdout is None:  # `layerwise ... >&-`: nowhere to write what was asked for
        print_error("standard output is closed; run the command with it open, or send it "
                    "to a file or /dev/null")
        sys.exit(2)
    try:
        code = app(standalone_mode=False)
    except _CLICK_ERROR as usage:  # a missing argument, an unknown option, a wrong type
        sys.exit(_usage_error(usage))
    except typer.Abort:
        sys.exit(1)
    except OSError as problem:
        if problem.errno not in _OUTPUT_ERRORS:
            raise
        _stop_writing()
        if problem.errno != errno.EPIPE:  # a reader that stopped reading is not an error
            print_error(f"cannot write the output: {problem.strerror}")
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


# click's base of every usage error, from the class Typer exports (Typer >= 0.22 carries its own
# click, older ones use the click package: this finds whichever it is)
_CLICK_ERROR: type[Exception] = next(
    base for base in typer.BadParameter.__mro__ if base.__name__ == "ClickException")


def _usage_error(usage: Exception) -> int:
    """Typer's usage errors (a missing argument, an unknown option, a value of the wrong type)
    as one line, like every other error, not a box of five; their exit code."""
    if type(usage).__name__ != "NoArgsIsHelpError":  # the help is the answer
        context = getattr(usage, "ctx", None)
        where = f"; see `{context.command_path} --help`" if context is not None else ""
        message = " ".join(usage.format_message().split()).rstrip(".")  # type: ignore[attr-defined]
        print_error(message + where)
    return int(usage.exit_code)  # type: ignore[attr-defined]


# Writing the output failed: a full disk (`> /dev/full`), a closed pipe (`| head`), a bad
# descriptor. One line, not a traceback.
_OUTPUT_ERRORS = frozenset({errno.ENOSPC, errno.EPIPE, errno.EBADF, errno.EIO})


def _stop_writing() -> None:
    """Point standard output at /dev/null, so that the interpreter's last flush of what could
    not be written raises nothing more."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
