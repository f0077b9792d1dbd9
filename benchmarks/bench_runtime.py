"""The runtime against torch's DDP, and the cost model's predictions against measured steps.

    .venv/bin/python benchmarks/bench_runtime.py                     # resnet18, 2 processes
    .venv/bin/python benchmarks/bench_runtime.py --model lenet5 --nproc 2 --steps 20
    .venv/bin/python benchmarks/bench_runtime.py --model alexnet --steps 8 --trials 3

All runs happen in this one invocation, on the same model, global batch and data, gloo on CPU
and NCCL on CUDA when there are enough GPUs:
- `one process`: the plain module, one process (the memory baseline);
- `DDP`: torch's DistributedDataParallel (the throughput baseline);
- `DDP + SyncBN` (models with BatchNorm): DDP normalising over the whole batch of all processes,
  the function one device and this runtime compute (plain DDP normalises each process's samples
  alone): torch's SyncBatchNorm on CUDA; on CPUs, where it raises, layerwise's synchronised
  BatchNorm (`layerwise.strategies.model.ops.sync_batch_norm`) in the same modules;
- `data`, `owt`, `layerwise`: this runtime under the data-parallel baseline, OWT and the
  strategy searched with a profile of this machine and a calibration of its links.
Huge pages (strategies/processes/huge_pages.py) are as the environment says, off unless
THP_MEM_ALLOC_ENABLE=1, for every run alike: in these interleaved steps DDP measured 1.25x slower
with them on while it gains alone (docs/performance.md), so the comparison keeps them off.
Each run first trains alone in fresh processes for its warm-up steps: its peak memory. Then come
`--trials` trials. Each calibrates the links and profiles the tiles the three strategies use (the
predictions) and then has one set of processes build every multi-process run side by side and give
each a step on every batch in turn (in a new seeded order for each batch): all step times, their
ratios and their ratios to the predictions come from these interleaved steps, so that every run
sees the same state of the machine, and each prediction comes from a calibration and a profile
taken just before (separate invocations of one run drift by up to 40% here, back-to-back profiles
of the same tiles by up to 28%, and calibrations' ring latency by up to 1.8x). Printed: medians
over the trials, and the range of measured/predicted; the ratios to DDP are paired, DDP's step over
the run's on the same batch, median over every trial's batches (the two steps ran moments apart, so
drift between batches stays out of the ratio).
The searched strategy comes from a profile of every configuration and a calibration taken first;
t_c comes from profiles of this machine taken with one profiler per rank at once on CPUs
(`profile_graph_concurrently`: ranks share the cores' caches and memory bandwidth), and the links
from a calibration, which also sets the runtime's bucketed gradient sync. Printed per run: median
step time, samples/s, the paired ratios to DDP, the cost model's predicted step time (profile +
calibration), measured/predicted and its range over the trials, and the peak of the tensors of
one more step per rank (strategies/runtime/memory_peak.py); then each prediction's parts:
compute (forward, backward and weight update), transfer and sync, and each strategy's speed-up
over data parallelism, predicted and measured.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table
from torch import nn

from layerwise.strategies.breakdown import Breakdown
from layerwise.strategies.cost.compute_time import ProfiledCompute
from layerwise.strategies.cost.cost_model import CostModel
from layerwise.strategies.cost.profile import (
    SGD_MOMENTUM,
    SGD_WEIGHT_DECAY,
    Profile,
    concurrent_threads,
    profile_graph,
    profile_graph_concurrently,
)
from layerwise.strategies.hardware.calibrate import calibrate, calibrated_cluster
from layerwise.strategies.hardware.cluster import Cluster
from layerwise.strategies.hardware.rendezvous import local_rendezvous
from layerwise.strategies.model.graph import build_graph
from layerwise.strategies.model.ops import sync_batch_norm
from layerwise.strategies.model.space import ParallelConfig
from layerwise.strategies.model.zoo import build_model
from layerwise.strategies.runtime.comm import Communicator, WaitClock, Waits
from layerwise.strategies.runtime.layerwise_executor import LayerwiseModel
from layerwise.strategies.runtime.memory_peak import measured_peak
from layerwise.strategies.runtime.plan import build_plan
from layerwise.strategies.runtime.worker import synchronize
from layerwise.strategies.search.baselines import baseline
from layerwise.strategies.search.elimination import optimal_strategy


@dataclass(frozen=True)
class Run:
    name: str  # the table's row
    mode: str  # "single", "ddp", "ddp_syncbn" or "layerwise"
    strategy: dict[str, str]  # layer -> config text, for "layerwise"


@dataclass(frozen=True)
class Job:
    model: str
    image_size: int
    batch: int  # global
    steps: int  # interleaved timed steps after the warm-up; 0: the warm-up alone
    warmup: int
    runs: tuple[Run, ...]
    threads: int
    cuda: bool


def _batches(job: Job, in_channels: int, device: torch.device,
             ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    shape = (job.batch, in_channels, job.image_size, job.image_size)
    return [(torch.randn(shape, generator=generator).to(device),
             torch.randint(0, 10, (job.batch,), generator=generator).to(device))
            for _ in range(job.warmup + job.steps)]


def _sgd(parameters: list[nn.Parameter]) -> torch.optim.SGD:
    """SGD as `layerwise train` runs it by default, the update the profile times."""
    return torch.optim.SGD(parameters, lr=0.01, momentum=SGD_MOMENTUM,
                           weight_decay=SGD_WEIGHT_DECAY)


def _step_function(job: Job, run: Run, rank: int, world: int,  # noqa: ANN202
                   device: torch.device):
    """One training step of the run on this rank, as a closure over (inputs, targets), and
    the clock of its communicator's waits (None: not this runtime)."""
    torch.manual_seed(0)
    module = build_model(job.model, num_classes=10, image_size=job.image_size, device=device)
    if run.mode == "layerwise":
        graph = build_graph(job.model, job.batch, job.image_size, 10)
        assignment = {name: ParallelConfig.parse(text) for name, text in run.strategy.items()}
        plan = build_plan(graph, assignment, world)
        model = LayerwiseModel(module, plan, Communicator(rank, world, plan.groups()))
        held = list(model.parameters())
        optimizer = _sgd(held) if held else None

        def layerwise_step(inputs: torch.Tensor, targets: torch.Tensor) -> None:
            model.forward_backward(inputs, targets)
            if optimizer is not None:
                optimizer.step()
                optimizer.zero_grad()
        return layerwise_step, model.comm.clock
    if run.mode == "ddp_syncbn":
        module = _whole_batch_norms(module, world, device)
    if run.mode in ("ddp", "ddp_syncbn"):
        module = torch.nn.parallel.DistributedDataParallel(
            module, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = _sgd(list(module.parameters()))
    share = slice(rank * job.batch // world, (rank + 1) * job.batch // world)

    def plain_step(inputs: torch.Tensor, targets: torch.Tensor) -> None:
        loss = F.cross_entropy(module(inputs[share]), targets[share])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return plain_step, None


class _WholeBatchNorm(nn.BatchNorm2d):
    """BatchNorm over the whole batch of every process (SyncBatchNorm semantics), on CPUs."""

    def __init__(self, source: nn.BatchNorm2d, world: int) -> None:
        if source.momentum is None:  # as the runtime: a cumulative average has no momentum
            raise ValueError("BatchNorm with momentum=None is not supported; set a momentum")
        super().__init__(source.num_features, source.eps, source.momentum, source.affine,
                         source.track_running_stats, device=source.weight.device,
                         dtype=source.weight.dtype)
        self.load_state_dict(source.state_dict())
        self.world = world

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        count = x.numel() // x.shape[1] * self.world  # equal shares of the batch
        return sync_batch_norm(x, self.weight, self.bias, self.running_mean, self.running_var,
                               float(self.momentum), self.eps, count, _sum_over_world)


def _sum_over_world(values: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(values)
    return values


def _whole_batch_norms(module: nn.Module, world: int, device: torch.device) -> nn.Module:
    """The module with every BatchNorm over the whole batch: torch's SyncBatchNorm on CUDA."""
    if device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(module)
    for parent in list(module.modules()):
        for name, child in parent.named_children():
            if isinstance(child, nn.BatchNorm2d):
                setattr(parent, name, _WholeBatchNorm(child, world))
    return module


def _has_batch_norm(model: str, image_size: int) -> bool:
    module = build_model(model, num_classes=10, image_size=image_size, device="meta")
    return any(isinstance(child, nn.modules.batchnorm._BatchNorm) for child in module.modules())


def _timed(step, batch: tuple[torch.Tensor, torch.Tensor],  # noqa: ANN001
           device: torch.device, clock: WaitClock | None = None) -> tuple[float, Waits]:
    """One step's seconds, started together on every rank, and what this rank waited in its
    communicator during it (`clock`'s; nothing without one)."""
    dist.barrier()
    synchronize(device)
    if clock is not None:
        clock.reset()
    started = time.perf_counter()
    step(*batch)
    synchronize(device)
    seconds = time.perf_counter() - started
    return seconds, clock.reset() if clock is not None else Waits({}, {})


def _worker(rank: int, world: int, rendezvous: str, job: Job, out: str) -> None:
    torch.set_num_threads(job.threads)
    device = torch.device("cuda", rank) if job.cuda else torch.device("cpu")
    if job.cuda:
        torch.cuda.set_device(device)
    backend = "nccl" if job.cuda else "gloo"
    dist.init_process_group(backend, init_method=rendezvous, rank=rank,
                            world_size=world)
    try:
        steps = [_step_function(job, run, rank, world, device) for run in job.runs]
        channels = build_graph(job.model, 2, job.image_size, 10).input_shape[1]
        batches = _batches(job, channels, device)
        for step, clock in steps:
            for batch in batches[:job.warmup]:
                _timed(step, batch, device, clock)
        times: list[list[float]] = [[] for _ in steps]
        waits: list[list[Waits]] = [[] for _ in steps]
        for index, batch in enumerate(batches[job.warmup:]):
            # a new order per batch, the same on every rank: no run always follows the same one
            for turn in random.Random(index).sample(range(len(steps)), len(steps)):
                step, clock = steps[turn]
                seconds, waited = _timed(step, batch, device, clock)
                times[turn].append(seconds)
                waits[turn].append(waited)
        with measured_peak(device) as peak:  # one more step of the first run, untimed
            _timed(steps[0][0], batches[0], device)
        memories: list[int | None] = [None] * world
        dist.all_gather_object(memories, peak.bytes)
        every_rank: list[list[list[Waits]] | None] = [None] * world
        dist.all_gather_object(every_rank, waits)
        result = {"memory": memories,
                  "seconds": {run.name: seconds
                              for run, seconds in zip(job.runs, times, strict=True) if seconds},
                  "waits": {run.name: [[tuple(waited) for waited in per_rank[turn]]
                                       for per_rank in every_rank]
                            for turn, run in enumerate(job.runs)
                            if times[turn] and steps[turn][1] is not None}}
        if rank == 0:
            torch.save(result, out)
    finally:
        dist.destroy_process_group()


def on_gpus(world: int) -> bool:
    """Whether `world` ranks run one per GPU over NCCL: where there are at least as many GPUs
    as ranks; else they are CPU processes over gloo."""
    return torch.cuda.is_available() and torch.cuda.device_count() >= world


def run(job: Job, world: int) -> dict[str, Any]:
    """The job on `world` fresh processes: {"memory": peak bytes per rank, "seconds": each
    timed step's seconds per run with timed steps, in batch order, "waits": per run of this
    runtime, per rank, per timed step (seconds, calls) waited in communication per
    category}."""
    with tempfile.TemporaryDirectory(prefix="layerwise-bench-") as folder:
        out = os.path.join(folder, "result.pt")
        torch_mp.start_processes(_worker, args=(world, local_rendezvous(folder), job, out),
                                 nprocs=world, join=True, start_method="spawn")
        return torch.load(Path(out))


def _paired_ratio(steps: list[dict[str, list[float]]], baseline_run: str, name: str) -> float:
    """The baseline's step time over the run's, batch by batch, median over every trial.

    The two steps of one batch ran moments apart in the same processes, so each ratio sees one
    state of the machine; a ratio of medians would mix the drift between batches into it.
    """
    return statistics.median(
        base / seconds for trial in steps
        for base, seconds in zip(trial[baseline_run], trial[name], strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--batch-per-device", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    for name in ("nproc", "batch_per_device", "steps", "warmup", "trials"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(args, name)})")
    console = Console(width=150)
    world = args.nproc
    cuda = on_gpus(world)
    threads = concurrent_threads(world)
    batch = args.batch_per_device * world
    graph = build_graph(args.model, batch, args.image_size, 10)

    backend = "nccl" if cuda else "gloo"

    def calibrated() -> Cluster:
        """This machine's links as they are now, printed."""
        console.print(f"calibrating {world} {backend} processes ...")
        calibration = calibrate(world, backend)
        console.print(f"  links: exchange {calibration.p2p_latency * 1e3:.2f} ms + "
                      f"{calibration.p2p_bandwidth / 1e6:.0f} MB/s, all-reduce ring steps "
                      f"{calibration.allreduce_latency * 1e3:.2f} ms + "
                      f"{calibration.allreduce_bandwidth / 1e6:.0f} MB/s")
        return calibrated_cluster(calibration)

    cluster = calibrated()

    def profile(configs: dict[str, list[ParallelConfig]] | None = None) -> Profile:
        if cuda:
            return profile_graph(graph, world, configs, device="cuda", threads=threads)
        # every core busy, as in the runs
        return profile_graph_concurrently(graph, world, world, configs=configs, device="cpu",
                                          threads=threads)

    console.print(f"profiling {args.model} on {world} devices ({threads} threads) ...")
    cost = CostModel(graph, cluster, world, ProfiledCompute(profile()))
    strategies = {"data": baseline("data", graph, world), "owt": baseline("owt", graph, world),
                  "layerwise": optimal_strategy(cost).assignment}
    used = {layer.name: sorted({assignment[layer.name] for assignment in strategies.values()},
                               key=lambda config: config.text) for layer in graph.layers}

    runs = [Run("DDP", "ddp", {})]
    if _has_batch_norm(args.model, args.image_size):
        runs.append(Run("DDP + SyncBN", "ddp_syncbn", {}))
    runs += [Run(name, "layerwise", {layer: config.text for layer, config in assignment.items()})
             for name, assignment in strategies.items()]

    def job(runs: tuple[Run, ...], steps: int) -> Job:
        return Job(model=args.model, image_size=args.image_size, batch=batch, steps=steps,
                   warmup=args.warmup, runs=runs, threads=threads, cuda=cuda)

    console.print(f"one process: {args.warmup} + {args.steps} steps ...")
    single = run(job((Run("one process", "single", {}),), args.steps), 1)
    memories = {"one process": single["memory"]}
    for each in runs:
        console.print(f"{each.name} alone: {args.warmup} steps for its peak memory ...")
        memories[each.name] = run(job((each,), 0), world)["memory"]
    steps: list[dict[str, list[float]]] = []
    predictions: list[dict[str, Breakdown]] = []
    for trial in range(1, args.trials + 1):
        console.print(f"trial {trial}/{args.trials}: a calibration, a profile of the "
                      f"strategies' tiles, then {len(runs)} runs side by side, {args.warmup} + "
                      f"{args.steps} steps each, interleaved")
        cost = CostModel(graph, calibrated(), world, ProfiledCompute(profile(used)))
        predictions.append({name: cost.evaluate(assignment)
                            for name, assignment in strategies.items()})
        steps.append(run(job(tuple(runs), args.steps), world)["seconds"])
    rounds = [{name: statistics.median(seconds) for name, seconds in trial.items()}
              for trial in steps]
    medians = {"one process": statistics.median(single["seconds"]["one process"])} | {
        name: statistics.median(trial[name] for trial in rounds) for name in rounds[0]}
    errors = {name: sorted(trial[name] / predicted[name].step_seconds
                           for trial, predicted in zip(rounds, predictions, strict=True))
              for name in strategies}

    single_memory = memories["one process"][0]
    table = Table(title=f"{args.model}, {args.image_size}px, global batch {batch}, {world} "
                        f"{'GPUs (nccl)' if cuda else 'CPU processes (gloo)'}; medians over "
                        f"{args.trials} trials")
    for column in ("run", "step ms", "samples/s", "vs DDP", "vs DDP+SyncBN", "predicted ms",
                   "measured/pred", "its range", "peak MB per rank", "memory vs 1 proc"):
        table.add_column(column, justify="left" if column == "run" else "right")
    synced = "DDP + SyncBN" in medians

    def paired(baseline_run: str, name: str) -> str:
        if name == "one process":  # not in the interleaved steps
            return f"{medians[baseline_run] / medians[name]:.2f}"
        return f"{_paired_ratio(steps, baseline_run, name):.2f}"

    for name, seconds in medians.items():
        predicted = (statistics.median(trial[name].step_seconds for trial in predictions)
                     if name in strategies else None)
        memory = [m / 2**20 for m in memories[name]]
        table.add_row(
            name, f"{seconds * 1e3:.1f}", f"{batch / seconds:.0f}",
            paired("DDP", name), paired("DDP + SyncBN", name) if synced else "",
            f"{predicted * 1e3:.1f}" if predicted else "",
            f"{statistics.median(errors[name]):.2f}" if name in errors else "",
            f"{errors[name][0]:.2f}-{errors[name][-1]:.2f}" if name in errors else "",
            " / ".join(f"{m:.0f}" for m in memory),
            f"{max(memory) * 2**20 / single_memory:.2f}")
    console.print(table)
    parts = Table(title="the predictions' parts (Eq. 1), ms per step, medians over the trials, "
                        "and each strategy's speed-up over data parallelism")
    fields = ("compute_seconds", "transfer_seconds", "sync_seconds", "step_seconds")
    for column in ("run", "compute (passes + update)", "transfer", "sync", "step",
                   "speed-up predicted", "speed-up measured"):
        parts.add_column(column, justify="left" if column == "run" else "right")
    median_parts = {name: [statistics.median(getattr(trial[name], field) for trial in predictions)
                           for field in fields] for name in strategies}
    for name, seconds in median_parts.items():
        parts.add_row(name, *(f"{value * 1e3:.1f}" for value in seconds),
                      f"{median_parts['data'][-1] / seconds[-1]:.2f}",
                      f"{medians['data'] / medians[name]:.2f}")
    console.print(parts)


if __name__ == "__main__":
    main()
