"""The runtime against torch's DDP, and the cost model's predictions against measured steps.

    .venv/bin/python benchmarks/bench_runtime.py                     # resnet18, 2 processes
    .venv/bin/python benchmarks/bench_runtime.py --model lenet5 --nproc 2 --steps 20

All runs happen side by side in this one invocation, on the same model, global batch and data,
each in fresh processes (gloo on CPU, NCCL on CUDA when there are enough GPUs) so that peak
memory is its own:
- `one process`: the plain module, one process (the memory baseline);
- `DDP`: torch's DistributedDataParallel (the throughput baseline);
- `DDP + SyncBN` (models with BatchNorm): DDP normalising over the whole batch of all processes,
  the function one device and this runtime compute (plain DDP normalises each process's samples
  alone): torch's SyncBatchNorm on CUDA; on CPUs, where it raises, layerwise's synchronised
  BatchNorm (`strategies.runtime.functions.sync_batch_norm`) in the same modules;
- `data`, `owt`, `layerwise`: this runtime under the data-parallel baseline, OWT and the
  strategy searched with a profile of this machine and a calibration of its links.
Each run of this runtime first trains alone (warm-up, then its steps: the peak memory), then
builds a DDP replica of the model in the same processes (and a DDP + SyncBN one) and alternates
their steps with its own (in turns, on the same batches) for its timed steps: its step time and
its ratios to them come from those interleaved steps, so that all see the same state of the
machine.
The prediction's t_c comes from a profile of this machine taken with one profiler per rank at
once on CPUs (`profile_graph_concurrently`: ranks share the cores' caches and memory bandwidth),
and its links from a calibration, which also sets the runtime's bucketed gradient sync.
Printed per run: median step time, samples/s, the ratio to DDP, the cost model's predicted step
time (profile + calibration) and measured/predicted, and the peak RSS (CPU) or peak allocated
memory (CUDA) per rank; then each prediction's parts: compute (forward, backward and weight
update), transfer and sync.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table
from torch import nn

from strategies.baselines import baseline
from strategies.calibrate import calibrate, calibrated_cluster
from strategies.cost import CostModel, ProfiledCompute
from strategies.graph import build_graph
from strategies.models import build_model
from strategies.profile import (
    SGD_MOMENTUM,
    SGD_WEIGHT_DECAY,
    concurrent_threads,
    profile_graph,
    profile_graph_concurrently,
)
from strategies.runtime.comm import Communicator, local_rendezvous
from strategies.runtime.executor import LayerwiseModel
from strategies.runtime.functions import sync_batch_norm
from strategies.runtime.plan import build_plan
from strategies.runtime.worker import peak_memory_bytes, synchronize
from strategies.search import optimal_strategy
from strategies.space import ParallelConfig


@dataclass(frozen=True)
class Job:
    model: str
    image_size: int
    batch: int  # global
    steps: int
    warmup: int
    mode: str  # "single", "ddp", "ddp_syncbn" or "layerwise"
    strategy: dict[str, str]
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


def _step_function(job: Job, rank: int, world: int, device: torch.device):  # noqa: ANN202
    """One training step of the job's mode on this rank, as a closure over (inputs, targets)."""
    torch.manual_seed(0)
    module = build_model(job.model, num_classes=10, image_size=job.image_size, device=device)
    if job.mode == "layerwise":
        graph = build_graph(job.model, job.batch, job.image_size, 10)
        assignment = {name: ParallelConfig.parse(text) for name, text in job.strategy.items()}
        plan = build_plan(graph, assignment, world)
        model = LayerwiseModel(module, plan, Communicator(rank, world, plan.groups()))
        held = list(model.parameters())
        optimizer = _sgd(held) if held else None

        def layerwise_step(inputs: torch.Tensor, targets: torch.Tensor) -> None:
            model.forward_backward(inputs, targets)
            if optimizer is not None:
                optimizer.step()
                optimizer.zero_grad()
        return layerwise_step
    if job.mode == "ddp_syncbn":
        module = _whole_batch_norms(module, world, device)
    if job.mode in ("ddp", "ddp_syncbn"):
        module = torch.nn.parallel.DistributedDataParallel(
            module, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = _sgd(list(module.parameters()))
    share = slice(rank * job.batch // world, (rank + 1) * job.batch // world)

    def plain_step(inputs: torch.Tensor, targets: torch.Tensor) -> None:
        loss = F.cross_entropy(module(inputs[share]), targets[share])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return plain_step


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
           device: torch.device) -> float:
    """One step's seconds, started together on every rank."""
    dist.barrier()
    synchronize(device)
    started = time.perf_counter()
    step(*batch)
    synchronize(device)
    return time.perf_counter() - started


def _worker(rank: int, world: int, rendezvous: str, job: Job, out: str) -> None:
    torch.set_num_threads(job.threads)
    device = torch.device("cuda", rank) if job.cuda else torch.device("cpu")
    if job.cuda:
        torch.cuda.set_device(device)
    backend = "nccl" if job.cuda else "gloo"
    dist.init_process_group(backend, init_method=rendezvous, rank=rank,
                            world_size=world)
    try:
        step = _step_function(job, rank, world, device)
        channels = build_graph(job.model, 2, job.image_size, 10).input_shape[1]
        batches = _batches(job, channels, device)
        times = [_timed(step, batch, device) for batch in batches][job.warmup:]
        memories: list[int | None] = [None] * world
        dist.all_gather_object(memories, peak_memory_bytes(device))
        result: dict[str, object] = {"median": statistics.median(times), "memory": memories}
        if job.mode == "layerwise":
            baselines = ["ddp", *(["ddp_syncbn"] if _has_batch_norm(job.model, job.image_size)
                                  else [])]
            steps = {"own": step} | {mode: _step_function(replace(job, mode=mode), rank,
                                                          world, device)
                                     for mode in baselines}
            for mode in baselines:
                for batch in batches[:job.warmup]:
                    _timed(steps[mode], batch, device)
            times: dict[str, list[float]] = {key: [] for key in steps}
            for index, batch in enumerate(batches[job.warmup:]):
                turns = list(steps.items())
                for key, function in turns if index % 2 else reversed(turns):
                    times[key].append(_timed(function, batch, device))
            result.update({key: statistics.median(values) for key, values in times.items()})
            result["median"] = result.pop("own")
        if rank == 0:
            torch.save(result, out)
    finally:
        dist.destroy_process_group()


def run(job: Job, world: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="layerwise-bench-") as folder:
        out = os.path.join(folder, "result.pt")
        torch_mp.start_processes(_worker, args=(world, local_rendezvous(folder), job, out),
                                 nprocs=world, join=True, start_method="spawn")
        return torch.load(Path(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--batch-per-device", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    console = Console(width=132)
    world = args.nproc
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= world
    threads = concurrent_threads(world)
    batch = args.batch_per_device * world
    graph = build_graph(args.model, batch, args.image_size, 10)

    console.print(f"calibrating {world} {'nccl' if cuda else 'gloo'} processes ...")
    cluster = calibrated_cluster(calibrate(world, "nccl" if cuda else "gloo"))
    console.print(f"profiling {args.model} on {world} devices ({threads} threads) ...")
    if cuda:
        profile = profile_graph(graph, world, device="cuda", threads=threads)
    else:  # every core busy, as in the runs
        profile = profile_graph_concurrently(graph, world, world, device="cpu", threads=threads)
    cost = CostModel(graph, cluster, world, ProfiledCompute(profile))
    strategies = {"data": baseline("data", graph, world), "owt": baseline("owt", graph, world),
                  "layerwise": optimal_strategy(cost).assignment}

    def job(mode: str, strategy: dict[str, ParallelConfig] | None = None) -> Job:
        texts = {name: config.text for name, config in (strategy or {}).items()}
        return Job(model=args.model, image_size=args.image_size, batch=batch,
                   steps=args.steps, warmup=args.warmup, mode=mode, strategy=texts,
                   threads=threads, cuda=cuda)

    rows = [("one process", run(job("single"), 1), None),
            ("DDP", run(job("ddp"), world), None)]
    if _has_batch_norm(args.model, args.image_size):
        rows.append(("DDP + SyncBN", run(job("ddp_syncbn"), world), None))
    breakdowns = {name: cost.evaluate(assignment) for name, assignment in strategies.items()}
    for name, assignment in strategies.items():
        rows.append((name, run(job("layerwise", assignment), world),
                     breakdowns[name].step_seconds))

    ddp_alone = float(rows[1][1]["median"])  # type: ignore[arg-type]
    single_memory = rows[0][1]["memory"][0]  # type: ignore[index]
    table = Table(title=f"{args.model}, {args.image_size}px, global batch {batch}, {world} "
                        f"{'GPUs (nccl)' if cuda else 'CPU processes (gloo)'}")
    synced_alone = next((float(result["median"]) for name, result, _ in rows  # type: ignore[arg-type]
                         if name == "DDP + SyncBN"), None)
    for column in ("run", "step ms", "samples/s", "vs DDP", "vs DDP+SyncBN", "predicted ms",
                   "measured/pred", "peak MB per rank", "memory vs 1 proc"):
        table.add_column(column, justify="left" if column == "run" else "right")
    for name, result, predicted in rows:
        seconds = float(result["median"])  # type: ignore[arg-type]
        ddp_seconds = float(result.get("ddp", ddp_alone))  # type: ignore[arg-type]
        synced = result.get("ddp_syncbn", synced_alone)
        memory = [m / 2**20 for m in result["memory"]]  # type: ignore[union-attr]
        table.add_row(
            name, f"{seconds * 1e3:.1f}", f"{batch / seconds:.0f}",
            f"{ddp_seconds / seconds:.2f}",
            f"{float(synced) / seconds:.2f}" if synced else "",  # type: ignore[arg-type]
            f"{predicted * 1e3:.1f}" if predicted else "",
            f"{seconds / predicted:.2f}" if predicted else "",
            " / ".join(f"{m:.0f}" for m in memory),
            f"{max(memory) * 2**20 / single_memory:.2f}")
    console.print(table)
    parts = Table(title="the predictions' parts (Eq. 1), ms per step")
    for column in ("run", "compute (passes + update)", "transfer", "sync", "step"):
        parts.add_column(column, justify="left" if column == "run" else "right")
    for name, breakdown in breakdowns.items():
        parts.add_row(name, *(f"{seconds * 1e3:.1f}" for seconds in (
            breakdown.compute_seconds, breakdown.transfer_seconds, breakdown.sync_seconds,
            breakdown.step_seconds)))
    console.print(parts)


if __name__ == "__main__":
    main()
