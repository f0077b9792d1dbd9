"""Measure this machine's torch.distributed links and write a cluster spec from them.

The cost model charges a transfer of m bytes alpha + m*beta (latency plus size over bandwidth) and a
ring all-reduce 2(p-1)(alpha + m*beta/p) (docs/research.md: ParaDL, ParaDL). `calibrate` starts
`nproc` local processes with the backend the runtime will use (gloo on CPU, NCCL on GPUs), measures
  - point-to-point: ranks 0 and 1 exchange a message at once through the runtime's own halo
    exchange (`runtime/halo_exchange.HaloExchange`: each packs its piece, sends it and receives
    the other's, and assembles its box from both; the backward's return of the gradient,
    summed into the producer's tile, alternates with it), the pattern and the host work of the
    runtime's transfers between layers. On a full-duplex link the wire part takes one one-way
    time; on CPUs with gloo both directions share the cores that copy them. Both ranks time
    it, and an exchange costs what the later of them waited (the rank that finished its layer
    first also waits out the other's rest of the layer, which in a step is the slower rank's
    compute, not the message's), plus what the layer after it takes longer than after
    another layer (`_exchanges`);
  - all_reduce over all ranks,
  - the copy of a bucket's gradients into its flat buffer that the runtime makes before each
    bucket's all-reduce (every rank at once, as in a step),
for message sizes from 4 B to 16 MiB, and fits alpha and beta by least squares on relative
error (so that 4 B and 16 MiB count alike). Each timed message follows a few milliseconds of
a convolution's work on every rank, as a message in a training step follows a layer's compute,
and exchanges are timed inside chains, as a step's transfers follow one another; a point is
the mean over its repeats, taken in rounds that visit every size in a new order (the machine's
drift then falls on all sizes alike): a step pays the sum of its messages, slow ones included.
With gloo on this project's 2-core machine that is what the runtime sees, and an idle message
is not: a small exchange right after a barrier takes 0.3 ms (median), and a small all-reduce's
mean is 2-3x its median.
`calibrated_cluster` puts the point-to-point fit into the `local` preset as its intra-node
link and the copy's bandwidth as its `bucket_copy_bandwidth`, so a search can plan for this
machine.

Workers come from a fork server that has imported this module (and torch) once: starting them
takes a fraction of a second instead of an import of torch per process.
"""

from __future__ import annotations

import datetime
import json
import multiprocessing
import os
import random
import socket
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp
from pydantic import BaseModel, ConfigDict

from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.files.atomic import writable_file, write_atomic, write_atomic_together
from layerwise.strategies.files.locations import PROFILE_DIR, safe_name
from layerwise.strategies.hardware.cluster import Cluster, Link, load_cluster
from layerwise.strategies.hardware.rendezvous import local_rendezvous
from layerwise.strategies.hardware.this_machine import device_name
from layerwise.strategies.processes.owned_folder import owned_folder
from layerwise.strategies.processes.parent_death import die_with_multiprocessing_parent
from layerwise.strategies.processes.terminate import start_then_join, terminate_as_exit
from layerwise.strategies.runtime.buckets import flatten_into
from layerwise.strategies.runtime.comm import Communicator
from layerwise.strategies.runtime.halo_exchange import HaloExchange
from layerwise.strategies.runtime.plan import InputPlan, Piece

__all__ = [
    "Calibration",
    "CalibrationPoint",
    "calibrate",
    "calibrated_cluster",
    "calibration_path",
    "save_calibration",
    "fit_alpha_beta",
    "message_sizes",
]

SCHEMA_VERSION = 1
BYTES_PER_ELEMENT = 4  # float32 messages, as the fp32 runtime sends
TIMEOUT = datetime.timedelta(seconds=60)  # a stuck collective fails instead of hanging
COMPUTE_SECONDS = 0.003  # of compute before each timed message, a small layer's worth
CHAIN = 3  # exchanges in a row per timed chain, the first untimed (`_exchanges`)
# How messages are timed, part of a kept calibration's name so that one timed another way is
# not reused: 4, the runtime's halo exchange, its time the later rank's and the next layer's
# slowing (3: a bare batch_isend_irecv, rank 0's time, its wait for rank 1's late layer
# included; 2: no bucket copy; 1: one exchange after a barrier and a deadline loop, which
# priced this machine's exchanges at 2-3x their cost in steps)
METHOD = 4
# a bucket's gradients in as many tensors, as a few layers' weights and biases
COPY_PIECES = 4

Backend = Literal["gloo", "nccl"]


PointKind = Literal["p2p", "p2p_after", "p2p_one_rank", "allreduce", "copy"]


class CalibrationPoint(BaseModel):
    """One measured message: mean seconds of one exchange (p2p: as the rank that reached it
    last waited, plus `p2p_after`, what the layer after it took longer than after a layer;
    p2p_one_rank: as rank 0 waited, the other rank's late layer included, nothing after), of
    one all_reduce, or of one copy of gradients into a bucket's flat buffer (copy)."""

    model_config = ConfigDict(frozen=True)

    kind: PointKind
    bytes: int
    seconds: float


class Calibration(BaseModel):
    """Measured links between `nproc` local processes and the alpha-beta fits."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = SCHEMA_VERSION
    backend: Backend
    nproc: int
    host: str
    torch_version: str
    points: list[CalibrationPoint]
    p2p_latency: float  # alpha, seconds
    p2p_bandwidth: float  # 1/beta, bytes/s, one direction
    allreduce_latency: float  # alpha of 2(p-1)(alpha + m*beta/p) fitted to the all_reduce times
    allreduce_bandwidth: float  # 1/beta of the same fit
    created: str
    # bytes/s of the runtime's copy of gradients into a bucket's flat buffer (None: a
    # calibration made before it was measured)
    copy_bandwidth: float | None = None

    @property
    def link(self) -> Link:
        """The fitted point-to-point link with the fitted all-reduce as its ring figures,
        rounded to 4 significant digits."""
        return Link(bandwidth=_round(self.p2p_bandwidth), latency=_round(self.p2p_latency),
                    ring_bandwidth=_round(self.allreduce_bandwidth),
                    ring_latency=_round(self.allreduce_latency))

    def p2p_seconds(self, nbytes: float) -> float:
        return self.p2p_latency + nbytes / self.p2p_bandwidth

    def allreduce_seconds(self, nbytes: float) -> float:
        """The fitted ring model 2(p-1)(alpha + m*beta/p) (ParaDL, docs/research.md: ParaDL)."""
        p = self.nproc
        return 2 * (p - 1) * (self.allreduce_latency + nbytes / (self.allreduce_bandwidth * p))

    def measured(self, kind: PointKind) -> list[CalibrationPoint]:
        return [point for point in self.points if point.kind == kind]

    def to_json(self) -> str:
        return self.model_dump_json(indent=1) + "\n"


def _round(value: float, digits: int = 4) -> float:
    return float(f"{value:.{digits}g}")


def message_sizes(quick: bool = False) -> list[int]:
    """Message sizes in bytes: powers of 4 from 4 B to 16 MiB (quick: 4 B, 1 KiB, 64 KiB, 1 MiB)."""
    if quick:
        return [4, 1 << 10, 1 << 16, 1 << 20]
    return [4 ** exponent for exponent in range(1, 13)]


# ---------------------------------------------------------------------------------------------
# The worker processes
# ---------------------------------------------------------------------------------------------


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Layer:
    """A small convolution layer's forward, repeated to take about COMPUTE_SECONDS: the work
    a rank does before it sends. The same number of repeats on every rank (rank 0's count),
    because a layer is a fixed amount of work; ranks then finish it apart by the machine's
    noise, as a step's ranks do. A loop of matrix products until a deadline instead ends on
    every rank at one wall time, and exchanges after it measured 2-3x what the runtime's
    exchanges cost inside steps (docs/cost-model.md, calibration)."""

    def __init__(self, device: torch.device) -> None:
        generator = torch.Generator().manual_seed(0)
        self.inputs = torch.randn(16, 6, 14, 14, generator=generator).to(device)
        self.weight = torch.randn(16, 6, 5, 5, generator=generator).to(device)
        self.repeats = 1
        self()  # warm up, then time
        _synchronize(device)
        started = time.perf_counter()
        for _ in range(8):
            self()
        _synchronize(device)
        each = (time.perf_counter() - started) / 8
        count = torch.tensor([max(1, round(COMPUTE_SECONDS / each))], device=device)
        dist.broadcast(count, src=0)
        self.repeats = int(count.item())

    def __call__(self) -> None:
        for _ in range(self.repeats):
            torch.nn.functional.conv2d(self.inputs, self.weight)
        _synchronize(self.inputs.device)


class _HaloPhase:
    """One exchange of the runtime's between ranks 0 and 1, `elements` each way: a layer
    split in two along channels whose consumer needs both halves on both ranks (a
    channel-split layer before another). Called forward, it is the runtime's gather (pack this
    rank's half, exchange, assemble the whole box); else its return of the gradient (pack the
    other rank's part of the box's gradient, exchange, sum both parts into this rank's tile's
    gradient)."""

    def __init__(self, comm: Communicator, device: torch.device, elements: int) -> None:
        halves = [((0, 1), (half, half + 1), (0, 1), (0, 1), (0, elements)) for half in (0, 1)]
        whole = ((0, 1), (0, 2), (0, 1), (0, 1), (0, elements))
        self.plan = InputPlan(index=0, producer="calibration", needed={0: whole, 1: whole},
                              pieces=tuple(Piece(source, target, halves[source])
                                           for source in (0, 1) for target in (0, 1)))
        self.box = halves[comm.rank]
        self.tile = torch.ones(1, 1, 1, 1, elements, device=device)
        self.gradient = torch.ones(1, 2, 1, 1, elements, device=device)
        self.halo = HaloExchange(comm, device, torch.float32)

    def __call__(self, forward: bool) -> None:
        if forward:
            self.halo.gather(0, self.plan, self.tile, self.box, 5, "calibration")
        else:
            self.halo.return_gradient(0, self.plan, self.gradient, self.box, None,
                                      "calibration")


def _seconds(layer: _Layer) -> float:
    start = time.perf_counter()
    layer()
    return time.perf_counter() - start


def _exchanges(rank: int, layer: _Layer, phase: _HaloPhase) -> list[tuple[float, float]]:
    """This rank's exchanges with the other of ranks 0 and 1 inside a chain, as a step's
    transfers meet them: after one barrier and `layer` twice, CHAIN exchanges, forward and
    backward phases in turn, each followed by `layer` on both ranks. Per exchange, the
    seconds this rank spent in it, and how much longer the layer right after it took than the
    same layer right after another (the chain's second): a layer after a wait pays to come back
    to its caches and its core, which a profile's back-to-back tiles never do. The first
    exchange is not timed: it carries the barrier's exit skew, which a message inside a step
    does not. Ranks above 1 only join the barrier (empty)."""
    dist.barrier()
    if rank > 1:
        return []
    layer()
    reference = _seconds(layer)
    timed = []
    for index in range(CHAIN):
        start = time.perf_counter()
        phase(forward=index % 2 == 0)
        _synchronize(phase.tile.device)
        waited = time.perf_counter() - start
        after = _seconds(layer)
        if index:
            timed.append((waited, after - reference))
    return timed


def _all_reduce(layer: _Layer, buffer: torch.Tensor) -> float:
    """This rank's time of one all_reduce, started together after a barrier and `layer`."""
    dist.barrier()
    layer()
    start = time.perf_counter()
    dist.all_reduce(buffer)
    _synchronize(buffer.device)
    return time.perf_counter() - start


def _bucket_copy(layer: _Layer, pieces: list[torch.Tensor], flat: torch.Tensor) -> float:
    """This rank's time of the runtime's copy of `pieces` into the reused flat buffer `flat`
    (`flatten_into`, as it fills a gradient bucket before its all-reduce), every rank at once
    after a barrier and `layer`, as a step's ranks copy theirs."""
    dist.barrier()
    layer()
    start = time.perf_counter()
    flatten_into(flat, pieces)  # sized for the pieces, which never view it: reused
    _synchronize(flat.device)
    return time.perf_counter() - start


def _worker(rank: int, nproc: int, rendezvous: str, backend: Backend, sizes: Sequence[int],
            warmup: int, repeats: int, result_path: str) -> None:
    """One rank: measure every size; rank 0 writes [kind, bytes, mean seconds] rows as JSON."""
    die_with_multiprocessing_parent()
    torch.set_num_threads(1)
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    try:
        dist.init_process_group(backend, init_method=rendezvous, rank=rank,
                                world_size=nproc, timeout=TIMEOUT)
        rows = _measure(rank, device, sizes, warmup, repeats)
    except BaseException as error:
        # When one rank fails the others fail next (closed connections): the time of each
        # failure lets the parent report the first, which is the cause.
        failure = {"rank": rank, "time": time.time(),
                   "error": f"{type(error).__name__}: {_last_line(str(error))}"}
        write_atomic(f"{result_path}.rank{rank}.error", json.dumps(failure), make_folder=False)
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if rank == 0:
        write_atomic(result_path, json.dumps(rows), make_folder=False)


def _measure(rank: int, device: torch.device, sizes: Sequence[int], warmup: int,
             repeats: int) -> list[tuple[str, int, float]]:
    """[kind, bytes, mean seconds] rows of every size (rank 0's; other ranks: empty).

    Each round times a chain of exchanges and one all_reduce of every size, the sizes in a
    new seeded order per round (the same on every rank): the machine's drift over the seconds a
    calibration takes then falls on all sizes alike; with each size's repeats in one block, a
    quiet or busy stretch would land on a few sizes alone and bend the fit.
    """
    layer = _Layer(device)
    buffers = {size: torch.ones(max(size // BYTES_PER_ELEMENT, 1), device=device)
               for size in sizes}
    comm = Communicator(rank, dist.get_world_size(), [])
    phases = {size: _HaloPhase(comm, device, buffer.numel()) for size, buffer in buffers.items()}
    pieces = {size: [torch.ones(max(size // BYTES_PER_ELEMENT // COPY_PIECES, 1), device=device)
                     for _ in range(COPY_PIECES)] for size in sizes}
    flats = {size: torch.empty(sum(piece.numel() for piece in parts), device=device)
             for size, parts in pieces.items()}
    mine: dict[int, list[tuple[float, float]]] = {size: [] for size in sizes}  # (wait, after)
    reduce: dict[int, list[float]] = {size: [] for size in sizes}
    copy: dict[int, list[float]] = {size: [] for size in sizes}
    for index in range(warmup + repeats):
        for size in random.Random(index).sample(list(sizes), len(sizes)):
            exchanged = _exchanges(rank, layer, phases[size])
            reduced = _all_reduce(layer, buffers[size])
            copied = _bucket_copy(layer, pieces[size], flats[size])
            if index < warmup:
                continue
            reduce[size].append(reduced)
            mine[size].extend(exchanged)
            copy[size].append(copied)
    exchanges: list[dict[int, list[tuple[float, float]]] | None] = (
        [None] * dist.get_world_size())
    dist.all_gather_object(exchanges, mine)
    if rank != 0:
        return []
    first, second = exchanges[0], exchanges[1]
    assert first is not None and second is not None  # every rank sent its own
    rows: list[tuple[str, int, float]] = []
    for size in sizes:
        nbytes = buffers[size].numel() * BYTES_PER_ELEMENT
        pairs = list(zip(first[size], second[size], strict=True))
        # per exchange, the rank that reached it last waited the message alone; each rank's
        # next layer pays to come back from the wait
        after = [(a[1] + b[1]) / 2 for a, b in pairs]
        rows.append(("p2p", nbytes, statistics.mean(
            min(a[0], b[0]) + slower for (a, b), slower in zip(pairs, after, strict=True))))
        rows.append(("p2p_after", nbytes, statistics.mean(after)))
        rows.append(("p2p_one_rank", nbytes, statistics.mean(wait for wait, _ in first[size])))
        rows.append(("allreduce", nbytes, statistics.mean(reduce[size])))
        rows.append(("copy", flats[size].numel() * BYTES_PER_ELEMENT,
                     statistics.mean(copy[size])))
    return rows


def _start_method() -> str:
    """forkserver (preloaded with torch and this module) where the platform has it."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return "spawn"
    multiprocessing.get_context("forkserver").set_forkserver_preload([__name__])
    return "forkserver"


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "unknown error"


def _worker_error(error: torch_mp.ProcessException, folder: Path, backend: Backend,
                  nproc: int) -> LayerwiseError:
    """One line naming the rank that failed first and its error."""
    failures = [json.loads(path.read_text(encoding="utf-8"))
                for path in Path(folder).glob("*.error")]
    where = f"({backend}, {nproc} processes)"
    if failures:
        first = min(failures, key=lambda failure: failure["time"])
        return LayerwiseError(
            f"calibration worker rank {first['rank']} {where} failed: {first['error']}")
    if isinstance(error, torch_mp.ProcessExitedException):
        return LayerwiseError(f"calibration worker rank {error.error_index} {where} exited "
                              f"with code {error.exit_code} before finishing")
    return LayerwiseError(
        f"calibration worker rank {error.error_index} {where} failed: {_last_line(str(error))}")


def _run_workers(nproc: int, backend: Backend, sizes: Sequence[int], warmup: int,
                 repeats: int) -> list[CalibrationPoint]:
    with terminate_as_exit(), owned_folder("layerwise-calibrate-") as folder:
        result_path = str(folder / "points.json")
        args = (nproc, local_rendezvous(folder), backend, list(sizes), warmup, repeats, result_path)
        try:
            start_then_join(lambda: torch_mp.start_processes(
                _worker, args=args, nprocs=nproc, join=False, start_method=_start_method()))
        except (torch_mp.ProcessRaisedException, torch_mp.ProcessExitedException) as error:
            raise _worker_error(error, folder, backend, nproc) from None
        rows = json.loads(Path(result_path).read_text(encoding="utf-8"))
    return [CalibrationPoint(kind=kind, bytes=nbytes, seconds=seconds)
            for kind, nbytes, seconds in rows]


# ---------------------------------------------------------------------------------------------
# Fits
# ---------------------------------------------------------------------------------------------


def fit_alpha_beta(nbytes: Sequence[float], seconds: Sequence[float],
                   latency_factor: float = 1.0, bytes_factor: float = 1.0,
                   ) -> tuple[float, float]:
    """(alpha, bandwidth = 1/beta) of t = latency_factor*alpha + bytes_factor*m*beta.

    Least squares on relative error: each row is divided by its measured time, so small
    messages (latency-bound) weigh as much as large ones (bandwidth-bound). A negative
    intercept (latency lost in noise) becomes the smallest per-message time, a non-positive
    slope the best measured bandwidth.
    """
    sizes = np.asarray(nbytes, dtype=float)
    times = np.asarray(seconds, dtype=float)
    if len(sizes) < 2 or np.any(times <= 0):
        raise LayerwiseError("fitting latency and bandwidth needs two or more positive times")
    design = np.stack([np.full_like(sizes, latency_factor), bytes_factor * sizes], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(design / times[:, None], np.ones_like(times), rcond=None)
    if alpha <= 0:
        alpha = float(np.min(times)) / latency_factor
    if beta <= 0:
        beta = 1.0 / float(np.max(bytes_factor * sizes / times))
    return float(alpha), float(1.0 / beta)


# ---------------------------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------------------------


def _resolve_backend(backend: str | None, nproc: int) -> Backend:
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend is None:
        usable = gpus >= nproc and dist.is_nccl_available()
        return "nccl" if usable else "gloo"
    if backend == "gloo":
        if not dist.is_gloo_available():
            raise LayerwiseError("this torch build has no gloo backend; try --backend nccl")
        return "gloo"
    if backend == "nccl":
        if not dist.is_nccl_available() or gpus == 0:
            raise LayerwiseError(
                f"--backend nccl needs CUDA GPUs and an NCCL build of torch; torch "
                f"{torch.__version__} here sees {gpus} GPUs; use --backend gloo"
            )
        if gpus < nproc:
            raise LayerwiseError(
                f"--backend nccl runs one process per GPU: {nproc} processes need {nproc} GPUs, "
                f"this machine has {gpus}; pass --nproc {gpus} or --backend gloo"
            )
        return "nccl"
    raise LayerwiseError(f"unknown backend '{backend}': use gloo or nccl")


def calibrate(nproc: int, backend: str | None = None, quick: bool = False) -> Calibration:
    """Measure point-to-point and all_reduce times between `nproc` local processes and fit them.

    `backend` None picks NCCL when there are `nproc` GPUs, else gloo. `quick` measures 4 sizes
    with few repeats (seconds, for tests); the full run takes 12 sizes from 4 B to 16 MiB.
    """
    if nproc < 2:
        raise LayerwiseError(
            f"calibration needs at least 2 processes to measure links between them "
            f"(got --nproc {nproc})"
        )
    chosen = _resolve_backend(backend, nproc)
    warmup, repeats = (1, 5) if quick else (3, 32)
    points = _run_workers(nproc, chosen, message_sizes(quick), warmup, repeats)
    p2p = [point for point in points if point.kind == "p2p"]
    reduce = [point for point in points if point.kind == "allreduce"]
    p2p_latency, p2p_bandwidth = fit_alpha_beta(
        [point.bytes for point in p2p], [point.seconds for point in p2p])
    ring_latency, ring_bandwidth = fit_alpha_beta(
        [point.bytes for point in reduce], [point.seconds for point in reduce],
        latency_factor=2 * (nproc - 1), bytes_factor=2 * (nproc - 1) / nproc)
    copied = [point for point in points if point.kind == "copy"]
    _, copy_bandwidth = fit_alpha_beta([point.bytes for point in copied],
                                       [point.seconds for point in copied])
    return Calibration(
        backend=chosen,
        nproc=nproc,
        host=socket.gethostname(),
        torch_version=torch.__version__,
        points=points,
        p2p_latency=p2p_latency,
        p2p_bandwidth=p2p_bandwidth,
        allreduce_latency=ring_latency,
        allreduce_bandwidth=ring_bandwidth,
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        copy_bandwidth=copy_bandwidth,
    )


def calibrated_cluster(calibration: Calibration, base: str | os.PathLike[str] | Cluster = "local",
                       ) -> Cluster:
    """`base` (the `local` preset) with `nproc` devices joined by the measured link.

    Only the intra-node link, the device count and the name change; device figures and the
    inter-node link stay those of `base`.
    """
    cluster = load_cluster(base)
    links = cluster.links.model_copy(update={"intra_node": calibration.link})
    description = (
        f"{calibration.nproc} {calibration.backend} processes on {calibration.host}, links "
        f"measured by layerwise calibrate at {calibration.created} (torch "
        f"{calibration.torch_version}); device figures from the '{cluster.name}' preset"
    )
    return cluster.model_copy(update={
        "name": f"{cluster.name}-calibrated",
        "description": description,
        "nodes": 1,
        "devices_per_node": calibration.nproc,
        "groups": None,
        "links": links,
        "sync": "bucketed",  # the runtime it measures sums gradients in buckets
        "bucket_copy_bandwidth": (None if calibration.copy_bandwidth is None
                                  else _round(calibration.copy_bandwidth)),
    })


def save_calibration(calibration: Calibration, out: str | os.PathLike[str]) -> Path:
    """Write the calibrated cluster to `out` and the raw measurements next to it as
    <stem>.calibration.json, both atomically; returns the measurements' path. The cluster file
    comes last, so that a file there means a complete calibration (the flow reuses it); a
    disk that fills up leaves neither."""
    cluster_path = writable_file(out)
    raw_path = cluster_path.with_name(f"{cluster_path.stem}.calibration.json")
    write_atomic_together({cluster_path: calibrated_cluster(calibration).to_yaml(),
                           raw_path: calibration.to_json()})
    return raw_path


def calibration_path(nproc: int, backend: str | None = None,
                     root: str | os.PathLike[str] | None = None) -> Path:
    """data/profiles/cluster-<device>-<backend>-x<nproc>-torch<version>-m<METHOD>.yaml under
    `root` (default: the current directory): where the benchmark flow keeps this machine's
    calibrated cluster. As a profile's key, anything that changes the links' times (the
    device, the backend, the process count, torch, how messages are timed) gets its own
    file."""
    chosen = _resolve_backend(backend, nproc)
    device = device_name("cuda" if chosen == "nccl" else "cpu")
    key = (f"cluster-{safe_name(device, 40)}-{chosen}-x{nproc}"
           f"-torch{safe_name(torch.__version__, 24)}-m{METHOD}")
    return Path(root if root is not None else ".") / PROFILE_DIR / f"{key}.yaml"
