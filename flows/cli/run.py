"""`layerwise run`: the benchmark flow with embedded defaults, nothing to start by hand.

    layerwise run
    layerwise run --config configs/benchmark.yaml --set steps=80 --set strategies=[data,owt]
    MLFLOW_TRACKING_URI=http://mlflow:5000 PREFECT_API_URL=http://prefect:4200/api layerwise run

Embedded defaults, each kept when the user set it: PREFECT_HOME in the project's .prefect/
(Prefect then runs its local ephemeral API; PREFECT_API_URL points it at a server instead),
Prefect's analytics off (the machine may be offline), MLflow on sqlite:////<project>/mlflow.db
with artifacts in <project>/mlartifacts and no download progress bars. `compare` and `serve`
use the same defaults (use_embedded_environment). The project is the current directory, as for
every `layerwise` command (runs/, data/). Prefect's local server, and torchrun, end with the
command however it ends, SIGKILL included (start_local_api, layerwise.strategies.jobs.tether).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from layerwise.flows.cli.console import console, print_error, user_errors
from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.text import printable

if TYPE_CHECKING:
    from layerwise.flows.benchmark_config import BenchmarkConfig


_INPUTS = {1: "signals", 2: "images", 3: "volumes"}  # what an input of so many dims is

def register(app: typer.Typer) -> None:
    """Add `run` to the CLI."""
    app.command("run")(run)


def embedded_environment(project: Path) -> dict[str, str]:
    """The defaults `layerwise run` sets where the user has not."""
    from layerwise.tasks.tracking.store_uri import TRACKING_VARIABLE, default_tracking_uri

    return {
        "PREFECT_HOME": str(project / ".prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        # and the clients': a local run sends nothing anywhere (the standard opt-out variable;
        # MLflow reads only "true", Prefect also "1" and "yes"; DO_NOT_TRACK=0 lets them)
        "DO_NOT_TRACK": "true",
        # the local server's first start migrates a fresh database: ~20 s on a 2-core machine,
        # Prefect's default limit (a busy machine then fails `layerwise run` before it starts)
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
        TRACKING_VARIABLE: default_tracking_uri(project),
        # reading artifacts back (compare) would draw a progress bar per file into the logs
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    }


def use_embedded_environment() -> None:
    """Set the embedded defaults for the project in the current directory, keeping whatever
    the user set. Every command that starts Prefect or opens MLflow calls this first: Prefect
    reads all its settings (home, startup timeout) once, when it is first imported, so
    nothing may import it before. A variable Prefect or MLflow could not read is one line
    here, naming it, instead of their tracebacks later."""
    for name, value in embedded_environment(Path.cwd().resolve()).items():
        os.environ.setdefault(name, value)
    _check_prefect_api_url(os.environ.get("PREFECT_API_URL", ""))
    from layerwise.tasks.tracking.store_uri import TRACKING_VARIABLE, check_tracking_uri

    check_tracking_uri(os.environ[TRACKING_VARIABLE])


def _check_prefect_api_url(url: str) -> None:
    """An http(s) URL with a host, or unset (Prefect's own local API)."""
    from urllib.parse import urlsplit

    if not url:
        return
    try:
        parts = urlsplit(url)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018 (raises on a port that is not a number)
    except ValueError:
        valid = False
    if not valid:
        raise LayerwiseError(f"PREFECT_API_URL={printable(url)} is not an http(s) URL of a "
                             "server (e.g. http://127.0.0.1:4200/api); fix or unset it")


def start_local_api() -> None:
    """Prefect's temporary local API server, started now and stopped with this process however
    it ends; nothing when PREFECT_API_URL names a server.

    Prefect starts that server (uvicorn, a subprocess) when a flow first needs it and stops it
    at exit, which a SIGKILL or a SIGTERM (`timeout`) skips: the server would go on listening
    on 127.0.0.1. Started here, it is the one the flow's client uses (Prefect keeps one per
    process), and a guard (strategies/jobs/tether.py) that stops it when this process dies is
    armed before its process exists, not after its seconds of start-up. A project's first
    start copies a migrated database in (prefect_database.py) instead of migrating its own.
    """
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return
    from layerwise.flows.cli.prefect_database import seed_project_database

    seed_project_database()
    _start_guarded_server()


def _start_guarded_server() -> None:
    """Prefect's server started (its project database already in place), its process guarded
    from the moment it exists; returns when the server answers."""
    from prefect.server.api.server import SubprocessASGIServer

    from layerwise.strategies.jobs.tether import guard, guarding_what_starts

    class GuardedServer(SubprocessASGIServer):
        """Prefect's temporary server, each process it starts guarded from its first
        instruction (the guard starts first: a SIGTERM or SIGKILL between the server's start
        and a guard's would leave it listening)."""

        def _run_uvicorn_command(self) -> subprocess.Popen[Any]:
            with guarding_what_starts():
                return super()._run_uvicorn_command()

    server = GuardedServer()  # Prefect's one server of this process, if one was made before
    server.start()
    if not isinstance(server, GuardedServer) and server.server_process is not None:
        guard(server.server_process.pid)


@contextlib.contextmanager
def local_api_starting() -> Iterator[None]:
    """start_local_api, its server started in a thread while the block runs: the server's
    process boots on another core (seconds of imports, its database, its lifespan) while this
    one imports the flow (MLflow, the stages). The block's end waits for the server to answer
    and raises what its start raised; a block that raises leaves at once, and the server, if it was
    started, stops with this process as start_local_api's does. The project's database is
    copied in here, in this thread (a thread stopped at exit could leave a copy half-made),
    and every module the start needs is imported here first, so that the two threads never
    import at once."""
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        yield
        return
    import prefect.server.api.server  # noqa: F401

    import layerwise.strategies.jobs.tether  # noqa: F401
    from layerwise.flows.cli.prefect_database import seed_project_database

    seed_project_database()
    failures: list[BaseException] = []

    def start() -> None:
        try:
            _start_guarded_server()
        except BaseException as error:  # raised where the block ends, in the command's thread
            failures.append(error)

    # a daemon: an error in the block exits at once, not after the server's start
    starting = threading.Thread(target=start, name="prefect-local-api", daemon=True)
    starting.start()
    yield
    starting.join()
    if failures:
        raise failures[0]


def _step(what: str) -> contextlib.AbstractContextManager[Any]:
    """A spinner saying what runs on a terminal; one line where the output is a file or a
    pipe, which shows no spinner."""
    if not console.is_terminal:
        console.print(f"{what} ...", highlight=False)
    return console.status(what, spinner="dots")


def plan_line(config: BenchmarkConfig) -> str:
    """What the run will do, said before Prefect's seconds of start-up: the models, strategies,
    processes and steps, and the flow's stages in order (those the config turns off left out)."""
    from layerwise.flows.benchmark_config import CALIBRATED

    stages = ["data", *(["calibrate"] if config.cluster == CALIBRATED else []),
              *(["profile"] if config.profile else []), "search",
              *(["verify"] if config.verify_steps else []), "train", "validate", "track"]
    models = ", ".join(f"{model.name} {model.version}" for model in config.models)
    return (f"benchmark '{config.name}': {models} x {len(config.strategies)} strategies "
            f"({', '.join(config.strategies)}) on {config.nproc} processes, {config.steps} "
            f"steps each; stages: {', '.join(stages)}")


def check_before_start(config: BenchmarkConfig) -> None:
    """What would fail inside the flow, found before Prefect starts (a second, not ten)."""
    from layerwise.flows.benchmark_config import CALIBRATED
    from layerwise.strategies.errors import LayerwiseError
    from layerwise.strategies.hardware.cluster import load_cluster
    from layerwise.strategies.hardware.host_memory import check_memory, training_bytes
    from layerwise.strategies.jobs.job import check_class_scores
    from layerwise.strategies.model.graph import build_graph
    from layerwise.strategies.runtime.datasets import GENERATED_DATASETS
    from layerwise.tasks.stages.prepare_data import PARAMS_FILE

    batch = config.global_batch
    for index, model in enumerate(config.models):
        try:
            graph = build_graph(model.name, batch=batch, num_classes=config.classes,
                                image_size=config.image_size)
            check_class_scores(graph, model.name, config.dataset)
        except LayerwiseError as error:
            raise LayerwiseError(f"config models.{index}.name: {error}") from None
        check_memory(training_bytes(graph), f"training {model.name} at a global batch of "
                     f"{batch} on {'x'.join(map(str, graph.input_shape[2:]))} "
                     f"{_INPUTS[len(graph.input_shape) - 2]}",
                     "set a smaller batch or image_size")
    # a calibrated cluster is the `local` preset with this machine's measured links
    name = "local" if config.cluster == CALIBRATED else config.cluster
    try:
        cluster = load_cluster(name)
    except LayerwiseError as error:
        raise LayerwiseError(f"config cluster: {error}") from None
    if cluster.num_devices < config.nproc:
        raise LayerwiseError(f"config cluster: '{cluster.name}' has {cluster.num_devices} "
                             f"devices, fewer than nproc {config.nproc}")
    if config.dataset not in GENERATED_DATASETS and not PARAMS_FILE.is_file():
        raise LayerwiseError(f"dataset {config.dataset} is prepared from {PARAMS_FILE}, which "
                             "is not here: run from the project root, or set dataset=synthetic")


def prepare_run(config: Path | None, overrides: list[str]) -> BenchmarkConfig:
    """Everything `layerwise run` does before the flow: the config, the embedded defaults,
    then the checks that would otherwise fail inside the flow. The defaults come before
    anything that could import Prefect, which reads its settings once, on first import."""
    from layerwise.flows.benchmark_config import load_config

    benchmark_config = load_config(config, overrides)
    use_embedded_environment()
    check_before_start(benchmark_config)
    return benchmark_config


@user_errors
def run(
    config: Annotated[Path | None, typer.Option(
        help="Benchmark YAML (default: the project's configs/benchmark.yaml, else the "
             "embedded defaults).")] = None,
    overrides: Annotated[list[str] | None, typer.Option(
        "--set", help="Override a field: key=value, dotted keys, YAML values "
                      "(--set steps=80, --set models.0.name=lenet5). Repeatable.")] = None,
) -> None:
    """Run the benchmark flow: data, profile, search, train, validate, track in MLflow."""
    started = time.perf_counter()
    with _step("checking the config and its models"):
        benchmark_config = prepare_run(config, overrides or [])
    console.print(plan_line(benchmark_config), highlight=False, soft_wrap=True)
    with _step("starting Prefect (its local API server takes 10-20 s)"), local_api_starting():
        from layerwise.flows.benchmark import benchmark, summary_lines
        from layerwise.flows.flow_runs import owned_flow_runs

    with owned_flow_runs():
        state = benchmark(benchmark_config, return_state=True)
    outcomes = state.result(raise_on_failure=False)
    if isinstance(outcomes, BaseException):  # the flow broke: a user error is one line (exit
        raise outcomes                       # 2, user_errors), anything else its traceback
    console.print(f"layerwise run took {time.perf_counter() - started:.1f} s in all "
                  "(with Prefect's start-up)", highlight=False)
    for line in summary_lines(outcomes):  # the verdict last, where a reader looks first
        console.print(line, highlight=False, soft_wrap=True)
    if state.is_failed():  # the lines above name what failed and why, once
        print_error(f"benchmark failed: {state.message}")
        raise typer.Exit(code=1)
