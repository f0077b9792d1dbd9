"""`layerwise serve`: the benchmark flow as a scheduled Prefect deployment.

    prefect server start                                  # another terminal; it runs the scheduler
    export PREFECT_API_URL=http://127.0.0.1:4200/api
    layerwise serve --cron "0 2 * * *"
    layerwise serve --cron "30 1 * * 1-5" --config nightly.yaml --set steps=200

The process serves until stopped (Ctrl-C) and runs each scheduled benchmark in this directory,
with the same embedded defaults as `layerwise run` (flows/cli/run.py). Prefect's ephemeral API runs
no scheduler, so without a server the deployment would never fire: the command says so in one
line instead of waiting forever. prefect.yaml holds the same deployment for work pools.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from layerwise.flows.cli.console import user_errors
from layerwise.flows.cli.run import use_embedded_environment
from layerwise.strategies.errors import LayerwiseError

DEPLOYMENT_NAME = "nightly-benchmark"
SERVER_HINT = ("run `prefect server start` (it runs the scheduler) and set "
               "PREFECT_API_URL=http://127.0.0.1:4200/api")
HEALTH_TIMEOUT_S = 5.0


def register(app: typer.Typer) -> None:
    """Add `serve` to the CLI."""
    app.command("serve")(serve)


@user_errors
def serve(
    cron: Annotated[str, typer.Option(
        help='When to run, as a cron expression: minute hour day month weekday '
             '("0 2 * * *" is 02:00 every day).')],
    config: Annotated[Path | None, typer.Option(
        help="Benchmark YAML (default: the project's configs/benchmark.yaml, else the "
             "embedded defaults).")] = None,
    overrides: Annotated[list[str] | None, typer.Option(
        "--set", help="Override a field: key=value, as `layerwise run --set`. Repeatable.")
    ] = None,
    name: Annotated[str, typer.Option(help="Deployment name.")] = DEPLOYMENT_NAME,
) -> None:
    """Serve the benchmark flow on a cron schedule (needs a Prefect server)."""
    from layerwise.flows.benchmark_config import load_config

    benchmark_config = load_config(config, overrides or [])
    use_embedded_environment()
    check_cron(cron)
    check_server()
    from layerwise.flows.benchmark import benchmark

    benchmark.serve(name=name, cron=cron,
                    parameters={"config": benchmark_config.model_dump(mode="json")})


def check_cron(cron: str) -> None:
    """One line for a cron string that is not five fields Prefect's schedule takes (croniter,
    behind it, would read a sixth field as seconds and fire every second)."""
    from prefect._internal.schemas.validators import validate_cron_string

    try:
        if len(cron.split()) != 5:
            raise ValueError(cron)
        validate_cron_string(cron)
    except ValueError:
        raise LayerwiseError(f"--cron {cron!r} is not a cron expression: write five fields, "
                             'minute hour day month weekday, e.g. "0 2 * * *"') from None


def check_server() -> None:
    """The configured Prefect server answers its health check, or one line saying what to do.

    The setting is read through Prefect, so PREFECT_API_URL in a Prefect profile counts too.
    """
    import httpx
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        raise LayerwiseError("no Prefect server: the local ephemeral API runs no scheduler, so "
                             f"a schedule would never fire; {SERVER_HINT}")
    try:
        httpx.get(f"{url.rstrip('/')}/health", timeout=HEALTH_TIMEOUT_S).raise_for_status()
    except httpx.HTTPError as error:
        raise LayerwiseError(f"the Prefect server at PREFECT_API_URL={url} does not answer "
                             f"({type(error).__name__}); {SERVER_HINT}") from None
