"""One rank of `layerwise train`: the torchrun entry point.

    python -m layerwise.strategies.jobs.agent --nproc-per-node 2 --max-restarts 0 \\
        -m layerwise.strategies.runtime.worker --out runs/RUN [runs/RUN2 ...] --steps 100 \\
        [--checkpoint-every 50 | --no-checkpoint] [--timeout 120] [--resume CHECKPOINT] \\
        [--reference reference.pt]

`layerwise train` checks everything, writes runs/RUN/strategy.json (the Strategy with the cost
model's prediction), runs/RUN/train.json (`TrainSettings`) and runs/RUN/graph.json (the layer graph
it checked them against, so that no worker pays seconds to trace the model under fake tensors
again), then starts exactly this command (torchrun's arguments; each rank a fork of the agent,
strategies/jobs/agent.py; `python -m torch.distributed.run` runs it the same): on one machine
in the environment of strategies/hardware/rendezvous.py (file stores, loopback only), on
several with `--nnodes --node-rank --rdzv-endpoint` (they share runs/RUN, which node 0 writes).
Each rank builds the same module from the same seed, keeps its shards (`LayerwiseModel`) and trains
on the same global batches with SGD at the schedule's learning rate of each step
(strategies/learning_rate.py). A loss that diverges (strategies/runtime/divergence.py) stops every
rank at that step: no checkpoint of it, result.json with the steps so far, and each rank's error
file saying so. Rank 0 prints one line per step, `LAYERWISE_PROGRESS {"step": .., "steps": ..,
"loss": .., "seconds": ..}`, for the launcher; writes checkpoint.pt every `--checkpoint-every` steps
and at the end (`--no-checkpoint`: never, for runs that are not resumed, such as `layerwise
verify`'s); and finally writes model.pt (the plain module's state_dict) and result.json
(`RunResult`). With `--reference` (`layerwise verify`: the plain module trained on the same batches,
strategies/exactness/reference.py) rank 0 compares its final weights and losses with it and writes
divergence.json instead of model.pt.

CPU processes use gloo; with a GPU per local process, rank r uses cuda:LOCAL_RANK and NCCL.
Every collective times out after `--timeout` seconds, so a dead peer ends the run instead of
hanging it. Any error writes runs/RUN/errors/rank{R}.json (rank, time, one-line error) before
the process exits non-zero, or, when no file can be written (a full disk), prints
`LAYERWISE_ERROR {json}` for the launcher; the launcher reports the earliest one. A worker dies
with its launcher (strategies/processes/parent_death.py), so a killed torchrun leaves none
training.

Fault drill: LAYERWISE_FAULT="RANK:STEP" makes rank RANK raise RuntimeError("injected fault")
right after step STEP (after that step's checkpoint, if any); "RANK:STEP:exit" makes it leave
with os._exit(13) instead, as a killed process would, without writing an error file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import socket
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.exactness.reference import ReferenceRun, compare
from layerwise.strategies.execution import LayerwiseExecution
from layerwise.strategies.files.atomic import atomic_path, save_tensors, write_atomic
from layerwise.strategies.files.locations import (
    CHECKPOINT_FILE,
    DIVERGENCE_FILE,
    ERRORS_DIR,
    GRAPH_FILE,
    MODEL_FILE,
    RESULT_FILE,
    SETTINGS_FILE,
    STRATEGY_FILE,
)
from layerwise.strategies.hardware.rendezvous import RENDEZVOUS_VARIABLE
from layerwise.strategies.hardware.this_machine import device_name
from layerwise.strategies.jobs.defaults import DEFAULT_CHECKPOINT_EVERY, DEFAULT_TIMEOUT_SECONDS
from layerwise.strategies.model.graph import LayerGraph
from layerwise.strategies.processes.huge_pages import huge_pages_in_use
from layerwise.strategies.processes.parent_death import die_with_parent, launcher_pid
from layerwise.strategies.runtime.checkpoint import (
    load_checkpoint,
    save_checkpoint,
    trained_weights,
)
from layerwise.strategies.runtime.comm import Category, Waits, init_distributed, least_waiting
from layerwise.strategies.runtime.datasets import GlobalBatches, load_dataset
from layerwise.strategies.runtime.divergence import LossDiverged, LossWatch, diverged_message
from layerwise.strategies.runtime.engine_protocol import Engine, EngineContext
from layerwise.strategies.runtime.initial_module import InitialModules, build_seeded
from layerwise.strategies.runtime.memory_peak import measured_peak
from layerwise.strategies.schedules import is_exact
from layerwise.strategies.schedules.loader import build_engine
from layerwise.strategies.strategy import Strategy
from layerwise.strategies.training_run import (
    ByteCounts,
    RunResult,
    StepRecord,
    TrainSettings,
    WaitSeconds,
)

PROGRESS_PREFIX = "LAYERWISE_PROGRESS "
# an error no file could hold (a full disk), said to the launcher on stdout instead
ERROR_PREFIX = "LAYERWISE_ERROR "
FAULT_VARIABLE = "LAYERWISE_FAULT"
KILLED_EXIT_CODE = 13
# Steps left out of the step-time statistics: the first ones allocate buffers and warm caches
# (at most this many, and never more than half the steps)
WARMUP_STEPS = 5

_SOURCE_LOCATION = re.compile(r"^\[[^\]]*:\d+\]\s*")  # gloo's "[.../pair.cc:553] " prefix

StepBytes = dict[tuple[str, Category], int]
StepWaits = Waits  # what one rank waited in one step, per category


@dataclass(frozen=True)
class Fault:
    """A drill: `rank` fails right after `step`, by raising or by exiting like a killed process."""

    rank: int
    step: int
    exit: bool

    @classmethod
    def from_environment(cls) -> Fault | None:
        text = os.environ.get(FAULT_VARIABLE, "").strip()
        if not text:
            return None
        parts = text.split(":")
        try:
            if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] != "exit"):
                raise ValueError(text)
            return cls(rank=int(parts[0]), step=int(parts[1]), exit=len(parts) == 3)
        except ValueError:
            raise LayerwiseError(f"{FAULT_VARIABLE}={text!r}: write RANK:STEP or "
                                 "RANK:STEP:exit, e.g. 1:3") from None

    def fire(self, rank: int, step: int) -> None:
        if (rank, step) != (self.rank, self.step):
            return
        if self.exit:
            os._exit(KILLED_EXIT_CODE)
        raise RuntimeError(f"injected fault after step {step} ({FAULT_VARIABLE}="
                           f"{self.rank}:{self.step})")


@dataclass
class Run:
    """One rank's share of the run and what it needs each step."""

    settings: TrainSettings
    strategy: Strategy
    context: EngineContext  # sets each step's learning rate on the engine's optimizers
    engine: Engine
    batches: GlobalBatches
    device: torch.device
    backend: str

    @property
    def rank(self) -> int:
        return self.engine.rank


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m layerwise.strategies.runtime.worker",
        description="One rank of a layer-wise training run (start it with torchrun).")
    parser.add_argument("--out", type=Path, nargs="+", required=True,
                        help=f"run folder holding {STRATEGY_FILE} and {SETTINGS_FILE}; several "
                             "train one after another in the same processes (layerwise verify "
                             "checks many strategies for the price of one start)")
    parser.add_argument("--steps", type=_positive, required=True,
                        help="train until this step (the launcher turns --epochs into steps)")
    saving = parser.add_mutually_exclusive_group()
    saving.add_argument("--checkpoint-every", type=_positive, default=DEFAULT_CHECKPOINT_EVERY,
                        help="steps between checkpoints (one is written at the end too)")
    saving.add_argument("--no-checkpoint", action="store_true",
                        help="write no checkpoint (the run is not resumed; model.pt is "
                             "still written)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_SECONDS,
                        help="seconds a collective may wait for its peers")
    parser.add_argument("--resume", type=Path, metavar="CHECKPOINT",
                        help=f"continue from this checkpoint (the run folder's {CHECKPOINT_FILE} "
                             "or the previous one the launcher fell back to)")
    parser.add_argument("--reference", type=Path, metavar="REFERENCE",
                        help="compare each run's final weights and losses with this plain-module "
                             f"run and write {DIVERGENCE_FILE} instead of {MODEL_FILE} "
                             "(layerwise verify)")
    args = parser.parse_args(argv)
    if args.resume is not None and len(args.out) > 1:
        parser.error("--resume continues one run folder")
    if args.resume is not None and args.no_checkpoint:
        parser.error("--resume needs the checkpoints --no-checkpoint leaves out")
    return args


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (got {value})")
    return value


def main(argv: list[str] | None = None) -> None:
    die_with_parent(launcher_pid())
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    out = args.out[0]
    try:
        process = join(args.timeout)
        reference = (ReferenceRun.load(args.reference)
                     if args.reference is not None and rank == 0 else None)
        modules = InitialModules() if len(args.out) > 1 else None  # verify's strategies
        for out in args.out:
            train(out, args, process, reference, modules)
    except BaseException as error:
        record_failure(out, rank, error)
        raise
    dist.destroy_process_group()


def record_failure(out: Path, rank: int, error: BaseException) -> None:
    """errors/rank{R}.json: the launcher names the rank whose error came first (the cause).
    Where that cannot be written (the error may be the full disk itself), the launcher hears
    it on stdout."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    message = _SOURCE_LOCATION.sub("", lines[0]) if lines else "no message"
    failure = {"rank": rank, "time": time.time(), "error": f"{type(error).__name__}: {message}"}
    try:
        write_atomic(out / ERRORS_DIR / f"rank{rank}.json", json.dumps(failure) + "\n")
    except LayerwiseError:
        print(ERROR_PREFIX + json.dumps(failure), flush=True)


@dataclass(frozen=True)
class Process:
    """This process's place in the job, joined once for all its run folders."""

    rank: int
    world: int
    device: torch.device
    backend: str


def join(timeout: float) -> Process:
    """Pick this process's device and join the torchrun job (on one machine through the
    launcher's file store, strategies/hardware/rendezvous.py)."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    device, backend = choose_device(local_rank, local_world)
    rank, world = init_distributed(backend, timeout, os.environ.get(RENDEZVOUS_VARIABLE))
    return Process(rank=rank, world=world, device=device, backend=backend)


def train(out: Path, args: argparse.Namespace, process: Process,
          reference: ReferenceRun | None = None, modules: InitialModules | None = None) -> None:
    """Train until --steps, checkpointing; rank 0 writes model.pt (with a `reference`, its
    divergence from it) and result.json at the end."""
    fault = Fault.from_environment()
    run = start(out, process, modules)
    checkpoint = out / CHECKPOINT_FILE
    done, records = (load_checkpoint(args.resume, run.engine) if args.resume is not None
                     else (0, []))
    if done >= args.steps:
        raise LayerwiseError(f"the checkpoint is at step {done}: ask for more steps")
    step_bytes: StepBytes = {}
    state = None
    watch = LossWatch(record.loss for record in records)
    stopped: str | None = None  # why the loss diverged, at the last step trained
    measured = min(done + 2, args.steps) if measures_memory(run, args) else None
    peak: int | None = None
    waits: dict[int, StepWaits] = {}  # this rank's, per step trained here
    for step in range(done + 1, args.steps + 1):
        if step == measured:
            with measured_peak(run.device) as memory:
                record, step_bytes, step_waits = train_step(run, step)
            record, peak = record.model_copy(update={"memory_measured": True}), memory.bytes
        else:
            record, step_bytes, step_waits = train_step(run, step)
        if step_waits is not None:
            waits[step] = step_waits
        records.append(record)
        if run.rank == 0:
            report_progress(record, args.steps)
        stopped = watch.add(record.loss)
        if stopped is not None:  # before any checkpoint: the last one holds sound weights
            break
        if args.no_checkpoint:
            state = trained_weights(run.engine) if step == args.steps else None
        elif step % args.checkpoint_every == 0 or step == args.steps:
            state = save_checkpoint(checkpoint, run.engine, step, records)
        if fault is not None:
            fault.fire(run.rank, step)
    last = records[-1].step
    result = gather_result(run, records, step_bytes, done, peak, waits,
                           diverged_at=last if stopped is not None else None)
    if stopped is not None:
        if result is not None:
            result.save(out / RESULT_FILE)
        raise LossDiverged(diverged_message(last, stopped, run.settings.lr))
    if state is not None and result is not None:
        if reference is not None:
            divergence = compare(result, state, reference,
                                 is_exact(run.strategy, run.context.graph))
            write_atomic(out / DIVERGENCE_FILE, divergence.model_dump_json() + "\n")
        else:
            with atomic_path(out / MODEL_FILE) as temporary:
                save_tensors(state, temporary, out / MODEL_FILE)
        result.save(out / RESULT_FILE)


def measures_memory(run: Run, args: argparse.Namespace) -> bool:
    """Whether this run measures its peak memory (in the second step of the launch, when the
    optimizer's state exists). Every rank decides alike, from what they share: not verify's
    float64 runs (only rank 0 holds the reference), and on the CPU only the layer-wise
    engine, since torch's profiler crashes the local engine's processes (SIGSEGV)."""
    return args.reference is None and (run.device.type == "cuda" or isinstance(
        run.strategy.execution, LayerwiseExecution))


def start(out: Path, process: Process, modules: InitialModules | None = None) -> Run:
    """Build this rank's engine (its model parts and optimizer) and batches for one run;
    `modules` holds the seeded module of an earlier run of the same launch."""
    settings = TrainSettings.load(out / SETTINGS_FILE)
    strategy = Strategy.load(out / STRATEGY_FILE)
    rank, world, device = process.rank, process.world, process.device
    if world != settings.world:
        raise LayerwiseError(f"{out / SETTINGS_FILE} is for {settings.world} processes, "
                             f"torchrun started {world}")
    graph = LayerGraph.model_validate_json((out / GRAPH_FILE).read_text(encoding="utf-8"))
    module = modules.build(settings) if modules is not None else build_seeded(settings)
    context = EngineContext(settings=settings, strategy=strategy, graph=graph,
                            module=module.to(device), rank=rank, world=world, device=device)
    engine = build_engine(context)
    data = load_dataset(settings.dataset, settings.image_size, settings.classes,
                        settings.in_channels, settings.seed, Path(settings.data_root))
    batches = GlobalBatches(data.train, settings.global_batch, settings.seed)
    return Run(settings=settings, strategy=strategy, context=context, engine=engine,
               batches=batches, device=device, backend=process.backend)


def choose_device(local_rank: int, local_world: int) -> tuple[torch.device, str]:
    """cuda:LOCAL_RANK with NCCL when every local process has a GPU, else the CPU with gloo."""
    if torch.cuda.is_available() and torch.cuda.device_count() >= local_world:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        return device, "nccl"
    return torch.device("cpu"), "gloo"


def train_step(run: Run, step: int) -> tuple[StepRecord, StepBytes, StepWaits | None]:
    """One SGD step on the global batch at the schedule's learning rate; its time excludes
    drawing the batch. The record holds rank 0's loss on every rank; the step's bytes and
    this rank's waits per category (None: the engine's waits are not clocked)."""
    x, y = run.batches.batch_at(step)
    inputs = torch.from_numpy(x).to(run.device, torch.get_default_dtype())
    targets = torch.from_numpy(y).to(run.device)
    run.context.start_step(step)
    synchronize(run.device)
    clock = run.engine.clock
    started = time.perf_counter()
    run.engine.counter.reset()
    if clock is not None:
        clock.reset()
    loss = run.engine.step(inputs, targets)
    step_bytes = run.engine.counter.reset()
    waits = clock.reset() if clock is not None else None
    synchronize(run.device)
    seconds = time.perf_counter() - started
    return (StepRecord(step=step, loss=rank0_loss(loss, run.device), seconds=seconds),
            step_bytes, waits)


def rank0_loss(loss: float, device: torch.device) -> float:
    """Rank 0's loss on every rank (engines return it there only), so that every rank judges
    divergence on the same numbers and stops at the same step. Eight bytes outside the timed
    step and outside the byte counts: control, not training."""
    shared = torch.tensor([loss], dtype=torch.float64, device=device)
    dist.broadcast(shared, src=0)
    return float(shared[0])


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def report_progress(record: StepRecord, total: int) -> None:
    line = {"step": record.step, "steps": total, "loss": record.loss, "seconds": record.seconds}
    print(PROGRESS_PREFIX + json.dumps(line), flush=True)


def gather_result(run: Run, records: list[StepRecord], step_bytes: StepBytes,
                  resumed_from: int, peak: int | None, waits: dict[int, StepWaits],
                  diverged_at: int | None = None) -> RunResult | None:
    """Sum every rank's bytes of a step, collect each rank's measured peak memory (None: not
    measured) and its waits per step (collective); the result on rank 0."""
    gathered: list[tuple[StepBytes, int | None, dict[int, StepWaits]] | None] = (
        [None] * dist.get_world_size())
    dist.all_gather_object(gathered, (step_bytes, peak, waits))
    if run.rank != 0:
        return None
    by_layer: dict[str, dict[str, int]] = {}
    for counts, _, _ in filter(None, gathered):
        for (layer, category), nbytes in counts.items():
            layer_bytes = by_layer.setdefault(layer, {})
            layer_bytes[category] = layer_bytes.get(category, 0) + nbytes

    def total(category: str) -> int:
        return sum(layer.get(category, 0) for layer in by_layer.values())

    warmup = warmup_steps(len(records))
    after_warmup = records[warmup:]
    timed_records = ([record for record in after_warmup if not record.memory_measured]
                     or after_warmup)
    timed = [record.seconds for record in timed_records]
    median = statistics.median(timed)
    quartiles = statistics.quantiles(timed, n=4) if len(timed) > 1 else [median] * 3
    predicted = run.strategy.predicted
    return RunResult(
        model=run.settings.model, strategy=run.strategy, nproc=run.settings.world,
        steps=tuple(records), warmup_steps=warmup, step_seconds_median=median,
        step_seconds_quartiles=(quartiles[0], quartiles[2]),
        throughput_samples_per_s=run.settings.global_batch / median,
        bytes_per_step=ByteCounts(transfer=total("transfer"), sync=total("sync")),
        predicted_bytes_per_step=ByteCounts(transfer=predicted.transfer_bytes,
                                            sync=predicted.sync_bytes),
        predicted_step_seconds=predicted.step_seconds,
        peak_memory_bytes_per_rank=_every_peak([peak for _, peak, _ in filter(None, gathered)]),
        loss_bytes_per_step=total("loss"), bytes_per_step_by_layer=by_layer,
        wait_seconds_per_step=least_waits([record.step for record in timed_records],
                                          [waits for _, _, waits in filter(None, gathered)]),
        global_batch=run.settings.global_batch, nnodes=run.settings.nnodes,
        resumed_from_step=resumed_from, diverged_at_step=diverged_at, settings=run.settings,
        backend=run.backend,
        device=device_name(run.device), torch_version=torch.__version__,
        huge_pages=huge_pages_in_use(), host=socket.gethostname(),
        finished=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    )


def least_waits(steps: list[int], ranks: list[dict[int, StepWaits]]) -> WaitSeconds | None:
    """WaitSeconds over `steps` from each rank's waits per step (None where a step has a rank
    without them: not clocked, or trained before a resume)."""
    per_step = [least_waiting([rank[step] for rank in ranks]).seconds for step in steps
                if all(step in rank for rank in ranks)]
    if not per_step:
        return None
    return WaitSeconds(**{category: statistics.median(waited.get(category, 0.0)
                                                      for waited in per_step)
                          for category in ("transfer", "sync", "loss")})


def _every_peak(peaks: list[int | None]) -> tuple[int, ...]:
    """Each rank's measured peak, or none when a rank could not measure its own."""
    return () if any(peak is None for peak in peaks) else tuple(peaks)  # type: ignore[arg-type]


def warmup_steps(steps: int) -> int:
    """How many of a run's first `steps` the step-time statistics leave out."""
    return min(WARMUP_STEPS, steps // 2)


if __name__ == "__main__":
    main()
