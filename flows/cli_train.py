"""`layerwise train`: train a model under a strategy on N torchrun processes and measure it.

    layerwise train tiny_cnn --strategy data --nproc 2 --steps 50 --image-size 16
    layerwise train lenet5 --strategy layerwise --nproc 4 --dataset digits --epochs 3
    layerwise train resnet18 --strategy resnet18.json --nproc 4 --image-size 32 --out runs/r18
    layerwise train resnet18 --resume runs/r18 --steps 400
    layerwise train vgg16 --strategy owt --nproc 4 --image-size 32 --out /shared/vgg16 \\
        --nnodes 2 --node-rank 0 --rdzv-endpoint node0:29500

Everything that can be wrong is found before any process starts (exit code 2, one line): the
strategy against the model's layer graph at the global batch (batch per device x processes),
the dataset against the model's input, the run folder. The launcher then writes the run folder
(strategy.json with the cost model's prediction, train.json, graph.json), starts torchrun in
its own process group and follows rank 0's progress lines. A failed run ends with one line
naming the rank that failed first and its error (exit code 1); a finished one with measured
throughput, step time and bytes per step next to the prediction.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.progress import (
    BarColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from flows.console import (
    DEFAULT_BATCH_PER_DEVICE,
    console,
    error_console,
    human_count,
    user_errors,
)

if TYPE_CHECKING:
    from strategies.graph import LayerGraph
    from strategies.run import RunResult, TrainSettings
    from strategies.runtime.datasets import GlobalBatches
    from strategies.strategy import Strategy

RUNS_DIR = Path("runs")
LOG_FILE = "torchrun.log"
STOP_GRACE_SECONDS = 10.0
# How gloo and NCCL report a peer that went away: a consequence, not a cause.
_PEER_LOST = re.compile(r"closed by peer|reset by peer|remote (worker|process)", re.IGNORECASE)
# torchrun's failure report (ChildFailedError): the rank and exit code of its first failure.
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+)\s*"
                         r"\(local_rank: \d+\)\s*exitcode\s*:\s*(-?\d+)", re.DOTALL)
# Defaults of the options that define a run (None on the command line means "not given", so
# that `--resume` can tell a repeated value from a changed one).
RUN_DEFAULTS: dict[str, Any] = {
    "nnodes": 1, "cluster": "local", "profile": None, "dataset": "synthetic",
    "batch_per_device": DEFAULT_BATCH_PER_DEVICE, "lr": 0.05, "momentum": 0.9,
    "weight_decay": 1e-4, "seed": 0,
}


@dataclass(frozen=True)
class Job:
    """A checked run, ready to launch: what it trains, where it writes, where it starts."""

    settings: TrainSettings
    strategy: Strategy
    graph: LayerGraph
    batches: GlobalBatches
    out: Path
    checkpoint_step: int | None  # the step to resume after; None starts at step 1


def register(app: typer.Typer) -> None:
    """Add `train` to the CLI."""
    app.command("train")(train)


@user_errors
def train(
    model: Annotated[str, typer.Argument(help="Zoo name or package.module:factory.")],
    strategy: Annotated[str | None, typer.Option(
        help="layerwise (search now), a baseline (data, model, owt, spatial_h, spatial_w), "
             "a scheduled strategy (owt_a|b|c[_vb], pipeline, local, local_overlap) or a "
             "strategy JSON file from `layerwise search --save`.")] = None,
    nproc: Annotated[int | None, typer.Option(help="Processes per node.")] = None,
    cluster: Annotated[str | None, typer.Option(
        help="Cluster preset or YAML for the prediction (default local).")] = None,
    profile: Annotated[Path | None, typer.Option(
        help="Profile JSON for the predicted t_c (default: the analytic roofline).")] = None,
    analytic: Annotated[bool, typer.Option(
        help="Predict t_c with the roofline on the cluster's device (the default).")] = False,
    dataset: Annotated[str | None, typer.Option(
        help="synthetic (any size, the default), digits (run `dvc repro prepare` first), "
             "cifar10, imagefolder or any folder prepared under data/prepared/.")
    ] = None,
    epochs: Annotated[int | None, typer.Option(
        help="Passes over the training split (default 1).")] = None,
    steps: Annotated[int | None, typer.Option(help="Train until this step instead.")] = None,
    batch_per_device: Annotated[int | None, typer.Option(
        help=f"Samples per process; the global batch is this x processes (default "
             f"{DEFAULT_BATCH_PER_DEVICE}).")] = None,
    image_size: Annotated[int | None, typer.Option(
        help="Input height and width (default: the dataset's, else the model's).")] = None,
    classes: Annotated[int | None, typer.Option(help="Number of classes.")] = None,
    in_channels: Annotated[int | None, typer.Option(help="Input channels.")] = None,
    lr: Annotated[float | None, typer.Option(help="SGD learning rate (default 0.05).")] = None,
    momentum: Annotated[float | None, typer.Option(help="SGD momentum (default 0.9).")] = None,
    weight_decay: Annotated[float | None, typer.Option(
        help="SGD weight decay (default 1e-4).")] = None,
    seed: Annotated[int | None, typer.Option(
        help="Seed of the weights, data order and dropout (default 0).")] = None,
    out: Annotated[Path | None, typer.Option(
        help="Run folder (default: a new one under runs/).")] = None,
    checkpoint_every: Annotated[int, typer.Option(
        help="Steps between checkpoints; one is always written at the end.")] = 100,
    resume: Annotated[Path | None, typer.Option(
        help="Continue the run in this folder from its last checkpoint, same settings.")
    ] = None,
    timeout: Annotated[float, typer.Option(
        help="Seconds a collective waits for the other ranks before the run fails.")] = 120.0,
    nnodes: Annotated[int | None, typer.Option(help="Machines (default 1).")] = None,
    node_rank: Annotated[int | None, typer.Option(
        help="This machine's index, with --nnodes > 1.")] = None,
    rdzv_endpoint: Annotated[str | None, typer.Option(
        help="HOST:PORT of node 0, with --nnodes > 1.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the RunResult JSON.")] = False,
) -> None:
    """Train MODEL under a strategy on N processes with torchrun; measure it against Eq. 1."""
    from strategies.runtime.worker import Fault

    given = {key: value for key, value in {
        "nproc": nproc, "nnodes": nnodes, "cluster": cluster,
        "profile": str(profile) if profile is not None else None, "dataset": dataset,
        "batch_per_device": batch_per_device, "image_size": image_size, "classes": classes,
        "in_channels": in_channels, "lr": lr, "momentum": momentum,
        "weight_decay": weight_decay, "seed": seed,
    }.items() if value is not None}
    check_numbers(given, steps, epochs, checkpoint_every, timeout)
    Fault.from_environment()  # a malformed drill is a user error before anything starts
    if resume is not None:
        job = _resumed_job(resume, model, strategy, given, out)
    else:
        job = new_job(model, strategy, given, out, analytic)
    total = total_steps(job, steps, epochs)
    command = torchrun_command(job, total, checkpoint_every, timeout, node_rank, rdzv_endpoint)
    write_run_folder(job)
    code = _run_torchrun(command, job, as_json)
    if code != 0:
        first_rank = (node_rank or 0) * job.settings.nproc
        line = failure_line(job.out, code, range(first_rank, first_rank + job.settings.nproc))
        error_console.print(f"[bold red]error:[/] {escape(line)}", highlight=False,
                            soft_wrap=True)
        raise typer.Exit(code=1)
    _report(job, as_json)


# ---------------------------------------------------------------------------------------------
# Checking a run before anything starts
# ---------------------------------------------------------------------------------------------


def check_numbers(given: dict[str, Any], steps: int | None, epochs: int | None,
                   checkpoint_every: int, timeout: float) -> None:
    from strategies.errors import LayerwiseError

    if steps is not None and epochs is not None:
        raise LayerwiseError("give --steps or --epochs, not both")
    positive = {"steps": steps, "epochs": epochs, "checkpoint_every": checkpoint_every,
                "timeout": timeout,
                **{key: given.get(key) for key in ("nproc", "nnodes", "batch_per_device", "lr")}}
    for name, value in positive.items():
        if value is not None and value <= 0:
            raise LayerwiseError(f"--{name.replace('_', '-')} must be > 0 (got {value})")
    for name in ("seed", "momentum", "weight_decay"):
        if given.get(name, 0) < 0:
            raise LayerwiseError(f"--{name.replace('_', '-')} must be >= 0 "
                                 f"(got {given[name]})")


def new_job(model: str, strategy: str | None, given: dict[str, Any], out: Path | None,
             analytic: bool) -> Job:
    """A run from the options given (defaults for the rest), checked before anything exists."""
    from strategies.errors import LayerwiseError
    from strategies.graph import build_graph
    from strategies.run import TrainSettings
    from strategies.runtime.datasets import DEFAULT_ROOT, prepared_spec

    if strategy is None:
        raise LayerwiseError("pass --strategy layerwise|data|model|owt|FILE (or --resume DIR)")
    if "nproc" not in given:
        raise LayerwiseError("pass --nproc N, the number of processes per node")
    folder = _fresh_out(out, model, strategy)
    options = {**RUN_DEFAULTS, **given}
    world = options["nproc"] * options["nnodes"]
    fixed = prepared_spec(options["dataset"], DEFAULT_ROOT)
    graph = build_graph(
        model, batch=options["batch_per_device"] * world,
        image_size=options.get("image_size", fixed.image_size if fixed else None),
        num_classes=options.get("classes", fixed.classes if fixed else None),
        in_channels=options.get("in_channels", fixed.channels if fixed else None))
    chosen = _resolve_strategy(strategy, graph, world, options, analytic)
    settings = TrainSettings(
        model=model, strategy=strategy, data_root=str(DEFAULT_ROOT.resolve()),
        image_size=graph.input_shape[2], in_channels=graph.input_shape[1],
        classes=graph.by_name[graph.outputs[0]].output_shape[1],
        **{key: options[key] for key in (*RUN_DEFAULTS, "nproc")})
    return Job(settings=settings, strategy=chosen, graph=graph, batches=_batches(settings),
               out=folder, checkpoint_step=None)


def _resumed_job(folder: Path, model: str, strategy: str | None, given: dict[str, Any],
                 out: Path | None) -> Job:
    """The run in `folder` as it was defined; options given again must not change it."""
    from strategies.errors import LayerwiseError
    from strategies.graph import build_graph
    from strategies.run import TrainSettings
    from strategies.runtime.checkpoint import CHECKPOINT_NAME, checkpoint_step
    from strategies.runtime.worker import SETTINGS_FILE, STRATEGY_FILE
    from strategies.strategy import Strategy

    settings = TrainSettings.load(folder / SETTINGS_FILE)
    if out is not None and out.resolve() != folder.resolve():
        raise LayerwiseError(f"--resume continues in {folder}; drop --out {out}")
    repeated = {"model": model, **given, **({"strategy": strategy} if strategy else {})}
    for key, value in repeated.items():
        if value != getattr(settings, key):
            raise LayerwiseError(
                f"--resume {folder} continues the same run: its {key} is "
                f"{getattr(settings, key)!r}, not {value!r}; drop that option or start a new run")
    graph = build_graph(settings.model, batch=settings.global_batch,
                        image_size=settings.image_size, num_classes=settings.classes,
                        in_channels=settings.in_channels)
    saved = Strategy.load(folder / STRATEGY_FILE)
    _check_strategy(saved, str(folder / STRATEGY_FILE), graph, settings.world)
    return Job(settings=settings, strategy=saved, graph=graph, batches=_batches(settings),
               out=folder, checkpoint_step=checkpoint_step(folder / CHECKPOINT_NAME))


def _resolve_strategy(spec: str, graph: LayerGraph, world: int, options: dict[str, Any],
                      analytic: bool) -> Strategy:
    """The strategy `spec` names, checked against `graph`, with the cost model's prediction."""
    from flows.cli_plan import baseline_strategy, cost_model, searched_strategy
    from strategies.baselines import BASELINES
    from strategies.cluster import load_cluster
    from strategies.errors import ConfigError, LayerwiseError
    from strategies.schedules import SCHEDULED, scheduled_strategy
    from strategies.strategy import Strategy

    cluster = load_cluster(options["cluster"])
    if cluster.num_devices < world:
        raise ConfigError(
            f"cluster '{cluster.name}' has {cluster.num_devices} devices, fewer than the {world} "
            f"processes; pass --cluster with at least {world} (e.g. a file written by "
            f"`layerwise calibrate --nproc {world}`)")
    profile = Path(options["profile"]) if options["profile"] else None
    cost = cost_model(graph, options["cluster"], world, profile, analytic or profile is None)
    if spec == "layerwise":
        return searched_strategy(cost)[0]
    if spec in BASELINES:
        return baseline_strategy(cost, spec)
    if spec in SCHEDULED:
        return scheduled_strategy(spec, cost)
    if not Path(spec).is_file():
        raise LayerwiseError(f"--strategy {spec}: not a strategy name (layerwise, "
                             f"{', '.join((*BASELINES, *SCHEDULED))}) nor a strategy file")
    loaded = Strategy.load(spec)
    assignment = _check_strategy(loaded, spec, graph, world)
    if loaded.execution.kind != "layerwise":  # Eq. 1 does not price its schedule
        return loaded
    return loaded.model_copy(update={"cluster": cost.cluster.name,
                                     "cost_source": cost.compute.name,
                                     "predicted": cost.evaluate(assignment)})


def _check_strategy(strategy: Strategy, source: str, graph: LayerGraph,
                    world: int) -> dict[str, Any]:
    """The strategy's configs after checking them against the model on `world` processes."""
    from strategies.errors import ConfigError
    from strategies.runtime.plan import build_plan

    try:
        assignment = strategy.check_against(graph, world)
        build_plan(graph, assignment, world)
    except ConfigError as error:
        raise ConfigError(f"--strategy {source}: {error}") from None
    return assignment


def _batches(settings: TrainSettings) -> GlobalBatches:
    """The run's batches: checks the dataset fits the model and holds a global batch."""
    from strategies.runtime.datasets import GlobalBatches, load_dataset

    data = load_dataset(settings.dataset, settings.image_size, settings.classes,
                        settings.in_channels, settings.seed, Path(settings.data_root))
    return GlobalBatches(data.train, settings.global_batch, settings.seed)


def _fresh_out(out: Path | None, model: str, strategy: str) -> Path:
    """`out` if it is new or empty, else a new folder under runs/ named after the run."""
    from strategies.errors import LayerwiseError

    if out is not None:
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise LayerwiseError(f"--out {out} already holds files; continue that run with "
                                 f"--resume {out} or choose a new folder")
        return out
    name = Path(strategy).stem if strategy.endswith(".json") else strategy
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{model}-{name}-{stamp}")
    candidate, suffix = RUNS_DIR / base, 1
    while candidate.exists():
        suffix += 1
        candidate = RUNS_DIR / f"{base}-{suffix}"
    return candidate


def total_steps(job: Job, steps: int | None, epochs: int | None) -> int:
    from strategies.errors import LayerwiseError

    total = steps if steps is not None else (epochs or 1) * job.batches.steps_per_epoch
    done = job.checkpoint_step or 0
    if total <= done:
        raise LayerwiseError(f"the checkpoint in {job.out} is at step {done}; ask for more "
                             f"with --steps N (N > {done})")
    return total


# ---------------------------------------------------------------------------------------------
# Launching
# ---------------------------------------------------------------------------------------------


def torchrun_command(job: Job, total: int, checkpoint_every: int, timeout: float,
                      node_rank: int | None, rdzv_endpoint: str | None) -> list[str]:
    from strategies.errors import LayerwiseError

    command = [sys.executable, "-m", "torch.distributed.run",
               "--nproc-per-node", str(job.settings.nproc), "--max-restarts", "0"]
    if job.settings.nnodes > 1:
        if node_rank is None or rdzv_endpoint is None:
            raise LayerwiseError("several nodes need --node-rank (this machine's index) and "
                                 "--rdzv-endpoint HOST:PORT (node 0's address)")
        command += ["--nnodes", str(job.settings.nnodes), "--node-rank", str(node_rank),
                    "--rdzv-endpoint", rdzv_endpoint]
    elif node_rank is not None or rdzv_endpoint is not None:
        raise LayerwiseError("--node-rank and --rdzv-endpoint are for --nnodes > 1")
    command += ["-m", "strategies.runtime.worker", "--out", str(job.out), "--steps", str(total),
                "--checkpoint-every", str(checkpoint_every), "--timeout", str(timeout)]
    if job.checkpoint_step is not None:
        command.append("--resume")
    return command


def write_run_folder(job: Job) -> None:
    """What the workers read; stale error files of an earlier attempt go."""
    from strategies.files import write_atomic
    from strategies.runtime.worker import (
        ERRORS_DIR,
        GRAPH_FILE,
        SETTINGS_FILE,
        STRATEGY_FILE,
    )

    job.out.mkdir(parents=True, exist_ok=True)
    job.strategy.save(job.out / STRATEGY_FILE)
    job.settings.save(job.out / SETTINGS_FILE)
    write_atomic(job.out / GRAPH_FILE, job.graph.model_dump_json() + "\n")
    shutil.rmtree(job.out / ERRORS_DIR, ignore_errors=True)


def _run_torchrun(command: list[str], job: Job, quiet: bool) -> int:
    """Run torchrun with a progress bar driven by rank 0's lines; returns its exit code."""
    return run_torchrun(command, job, lambda lines: _follow(lines, job, quiet))


def run_torchrun(command: list[str], job: Job, follow: Callable[[IO[str]], None],
                 deadline_s: float | None = None) -> int:
    """Run torchrun in its own process group; returns its exit code.

    Its stderr (torchrun's and the workers' logs and tracebacks) goes to torchrun.log in the
    run folder; its stdout (rank 0's progress lines and anything else) goes to `follow`. If
    the launcher is stopped (Ctrl-C, or SIGTERM from a scheduler), the whole group is stopped
    with it. With `deadline_s`, a timer stops the group when it runs longer (a blocked read of
    its output would never notice) and TimeoutError is raised.
    """
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(job.out / LOG_FILE, "a", encoding="utf-8") as log, _terminate_as_exit():
        log.write(f"$ {' '.join(command)}\n")
        log.flush()
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True,
                                   env=environment, start_new_session=True)
        expired = threading.Event()
        timer = _deadline_timer(process, expired, deadline_s)
        try:
            assert process.stdout is not None
            follow(process.stdout)
            code = process.wait()
        except BaseException:
            _stop(process)
            raise
        finally:
            if timer is not None:
                timer.cancel()
    if expired.is_set():
        raise TimeoutError(f"training ran past its deadline of {deadline_s:g} s; torchrun and "
                           f"its workers were stopped (log: {job.out / LOG_FILE})")
    return code


def _deadline_timer(process: subprocess.Popen[str], expired: threading.Event,
                    deadline_s: float | None) -> threading.Timer | None:
    """A started timer that stops `process`'s group after `deadline_s` and sets `expired`."""
    if deadline_s is None:
        return None

    def expire() -> None:
        expired.set()
        _stop(process)

    timer = threading.Timer(deadline_s, expire)
    timer.daemon = True
    timer.start()
    return timer


@contextlib.contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """Let SIGTERM unwind the launcher like Ctrl-C does (main thread only, where Python allows
    handlers), so that the torchrun group it started is stopped rather than orphaned."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def exit_on_terminate(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_on_terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _follow(lines: IO[str], job: Job, quiet: bool) -> None:
    """Drive a progress bar from rank 0's progress lines; pass every other line on."""
    from strategies.runtime.worker import PROGRESS_PREFIX

    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[loss]}"),
               TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn())
    with Progress(*columns, console=console, disable=quiet or not console.is_terminal) as bar:
        task = bar.add_task(f"starting {job.settings.world} processes", total=None, loss="")
        started = False
        for line in lines:
            if not line.startswith(PROGRESS_PREFIX):
                (error_console if quiet else bar.console).print(
                    line.rstrip("\n"), markup=False, highlight=False)
                continue
            progress = json.loads(line[len(PROGRESS_PREFIX):])
            if not started:  # a resumed run starts part way: estimate the rest from here on
                bar.reset(task, total=progress["steps"], completed=progress["step"] - 1)
                started = True
            finishing = ", saving" if progress["step"] == progress["steps"] else ""
            bar.update(task, completed=progress["step"], loss=f"loss {progress['loss']:.4f}",
                       description=f"step {progress['step']}/{progress['steps']}{finishing}")


def _stop(process: subprocess.Popen[str]) -> None:
    """Terminate torchrun and its workers; kill them if they do not go within a grace time."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=STOP_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        return


def failure_line(out: Path, code: int, local_ranks: range) -> str:
    """The rank whose error came first (the cause; the others fail after it) and its error.

    A rank that was killed records nothing, and its peers then fail on the lost connection;
    then the silent ranks of this node are named as the likely cause.
    """
    from strategies.runtime.worker import ERRORS_DIR

    failures = []
    for path in sorted((out / ERRORS_DIR).glob("rank*.json")):
        try:
            failures.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    where = f"torchrun exit code {code}; log: {out / LOG_FILE}"
    silent = sorted(set(local_ranks) - {failure["rank"] for failure in failures})
    if not failures:
        return _unrecorded_failure(out / LOG_FILE, where)
    first = min(failures, key=lambda failure: failure["time"])
    if silent and _PEER_LOST.search(first["error"]):
        names = ", ".join(map(str, silent))
        return (f"training failed: rank {names} stopped without an error (killed, or out of "
                f"memory?), then rank {first['rank']} lost it: {first['error']} ({where})")
    return f"training failed: rank {first['rank']} failed first: {first['error']} ({where})"


def _unrecorded_failure(log: Path, where: str) -> str:
    """The failure line when no rank wrote an error: torchrun's own first failure, if logged.

    A rank that dies without a word (os._exit, SIGKILL, the OOM killer) can be noticed by
    torchrun before its peers notice the lost connection; torchrun then stops them (SIGTERM)
    and they record nothing either. Its report names the first rank that exited.
    """
    try:
        causes = _ROOT_CAUSE.findall(log.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        causes = []
    if not causes:
        return f"training failed: no rank recorded an error (a process was killed?) ({where})"
    rank, exit_code = causes[-1]  # the log gathers every launch of a resumed run
    return (f"training failed: rank {rank} stopped without an error (exit code {exit_code}: "
            f"killed, or out of memory?); torchrun then stopped the other ranks ({where})")


# ---------------------------------------------------------------------------------------------
# The summary
# ---------------------------------------------------------------------------------------------


def _report(job: Job, as_json: bool) -> None:
    from strategies.run import RunResult
    from strategies.runtime.checkpoint import CHECKPOINT_NAME
    from strategies.runtime.worker import MODEL_FILE, RESULT_FILE

    result = RunResult.load(job.out / RESULT_FILE)
    if as_json:
        sys.stdout.write(result.model_dump_json(indent=2) + "\n")
        return
    _print_summary(result)
    last = result.steps[-1].step
    console.print(
        f"result      {job.out / RESULT_FILE}\n"
        f"model       {job.out / MODEL_FILE} (a state_dict for the plain module)\n"
        f"checkpoint  {job.out / CHECKPOINT_NAME} (step {last}; continue with --resume "
        f"{job.out} --steps N)", highlight=False, soft_wrap=True)


def _print_summary(result: RunResult) -> None:
    first, last = result.steps[0], result.steps[-1]
    resumed = f", resumed after step {result.resumed_from_step}" if result.resumed_from_step else ""
    console.print(
        f"trained {result.model} under '{result.strategy.name}' on {result.nproc} processes "
        f"({result.backend}, {result.device}): steps {first.step}-{last.step}{resumed}, "
        f"global batch {result.global_batch}, loss {first.loss:.4f} -> {last.loss:.4f}",
        highlight=False, soft_wrap=True)
    console.print(f"execution: {result.strategy.execution.describe()}", highlight=False,
                  soft_wrap=True)
    table = Table(title="per training step", title_justify="left")
    for column in ("", "measured", "predicted"):
        table.add_column(column, justify="left" if not column else "right")
    predicted_samples = result.global_batch / result.predicted_step_seconds
    table.add_row("median step", f"{result.step_seconds_median * 1e3:.2f} ms",
                  f"{result.predicted_step_seconds * 1e3:.2f} ms")
    table.add_row("samples/s", f"{result.throughput_samples_per_s:,.1f}",
                  f"{predicted_samples:,.1f}")
    for category in ("transfer", "sync"):
        table.add_row(f"{category} bytes", f"{getattr(result.bytes_per_step, category):,}",
                      f"{getattr(result.predicted_bytes_per_step, category):,}")
    console.print(table)
    peaks = ", ".join(f"{human_count(peak)}B" for peak in result.peak_memory_bytes_per_rank)
    console.print(f"peak memory per rank: {peaks}; the loss's own all-reduces sent "
                  f"{result.loss_bytes_per_step:,} bytes per step (not in Eq. 1)",
                  highlight=False, soft_wrap=True)
