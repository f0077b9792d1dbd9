"""Run training cases on N gloo processes and on one plain module, for the equivalence tests.

One launch of N processes runs many cases in sequence (starting processes costs seconds;
a case costs milliseconds). Each case: a model, a strategy (layer name -> config text), a
global batch and a few SGD steps on seeded random data. The plain module trains on the same
global batches in the parent; the tests compare losses, parameters and buffers.
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp
import torch.nn.functional as F

from layerwise.strategies.hardware.rendezvous import local_rendezvous
from layerwise.strategies.model.graph import build_graph
from layerwise.strategies.model.space import ParallelConfig
from layerwise.strategies.model.zoo import build_model
from layerwise.strategies.runtime.comm import Communicator
from layerwise.strategies.runtime.layerwise_executor import LayerwiseModel
from layerwise.strategies.runtime.plan import build_plan


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now (a rendezvous or a server's)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class Case:
    model: str
    strategy: dict[str, str]
    batch: int
    image_size: int = 32
    num_classes: int = 10
    steps: int = 2
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 1e-4
    seed: int = 0
    double: bool = False  # fp64: rounding too small to flip a max-pool tie or a ReLU


@dataclass
class Outcome:
    losses: list[float]
    state: dict[str, torch.Tensor]
    bytes_by_rank: list[dict[tuple[str, str], int]] = field(default_factory=list)
    # per rank, the last step's seconds waited in communication per category
    waits_by_rank: list[dict[str, float]] = field(default_factory=list)


def assert_same_training(outcome: Outcome, expected: Outcome, tolerance: dict[str, float],
                         label: str) -> None:
    """Equal losses and an equal final state (integer buffers exactly), named by `label`."""
    torch.testing.assert_close(torch.tensor(outcome.losses, dtype=torch.float64),
                               torch.tensor(expected.losses, dtype=torch.float64), **tolerance)
    assert outcome.state.keys() == expected.state.keys()
    for key, value in expected.state.items():
        tolerances = tolerance if value.is_floating_point() else {"rtol": 0, "atol": 0}
        if not _plainly_close(outcome.state[key], value, **tolerances):
            torch.testing.assert_close(outcome.state[key], value, **tolerances,
                                       msg=lambda text, key=key: f"{label} {key}: {text}")


def _plainly_close(actual: torch.Tensor, expected: torch.Tensor, rtol: float,
                   atol: float) -> bool:
    """assert_close's criterion |a - b| <= atol + rtol |b| on finite values of one shape and
    dtype, in four passes: assert_close takes ~9 s on VGG-16's 102M-weight classifier. Only
    an acceptance: anything else (NaN, inf, a mismatch) goes to assert_close for its verdict."""
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return False
    if not expected.is_floating_point():
        return bool(torch.equal(actual, expected))
    bound = expected.abs().mul_(rtol).add_(atol)
    return bool(((actual - expected).abs_() <= bound).all())


def batches(case: Case, in_channels: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The global batches of every step, from their own generator (not the global one)."""
    generator = torch.Generator().manual_seed(1000 + case.seed)
    shape = (case.batch, in_channels, case.image_size, case.image_size)
    return [(torch.randn(shape, generator=generator),
             torch.randint(0, case.num_classes, (case.batch,), generator=generator))
            for _ in range(case.steps)]


def _module(case: Case) -> torch.nn.Module:
    torch.set_default_dtype(torch.float64 if case.double else torch.float32)
    torch.manual_seed(case.seed)
    return build_model(case.model, num_classes=case.num_classes, image_size=case.image_size)


# (setting) -> the seeded initial weights and the generator's state after drawing them
_INITIAL: dict[tuple[object, ...], tuple[dict[str, torch.Tensor], torch.Tensor]] = {}


def _fresh_module(case: Case) -> torch.nn.Module:
    """`_module(case)` for a worker that runs many cases: the seeded weights are drawn once
    per setting and process (VGG-16's 134M fp64 weights take ~6 s to draw here); later cases
    get a module on the meta device that takes them over, and the generator continues from
    where drawing them left it (the dropout masks come next). LayerwiseModel only copies its
    shards out of the module it is given, so the kept weights stay as drawn."""
    key = (case.model, case.num_classes, case.image_size, case.seed, case.double)
    if key not in _INITIAL:
        module = _module(case)
        _INITIAL.clear()  # one setting at a time: a launch's cases come grouped by setting
        _INITIAL[key] = ({name: value.detach().clone()
                          for name, value in module.state_dict().items()},
                         torch.get_rng_state())
        return module
    state, generator = _INITIAL[key]
    torch.set_default_dtype(torch.float64 if case.double else torch.float32)
    module = build_model(case.model, num_classes=case.num_classes, image_size=case.image_size,
                         device="meta")
    module.load_state_dict(state, assign=True)
    torch.set_rng_state(generator)
    return module


def _optimizer(case: Case, parameters) -> torch.optim.Optimizer | None:
    """SGD over the parameters; None for a rank that holds no weights under the strategy."""
    held = list(parameters)
    if not held:
        return None
    return torch.optim.SGD(held, lr=case.lr, momentum=case.momentum,
                           weight_decay=case.weight_decay)


def reference(case: Case) -> Outcome:
    """The plain module on one process, mean cross-entropy over the global batch."""
    graph = build_graph(case.model, case.batch, case.image_size, case.num_classes)
    module = _module(case)
    try:
        optimizer = _optimizer(case, module.parameters())
        assert optimizer is not None
        losses = []
        for inputs, targets in batches(case, graph.input_shape[1]):
            optimizer.zero_grad()
            loss = F.cross_entropy(module(inputs), targets)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
    finally:
        torch.set_default_dtype(torch.float32)
    return Outcome(losses=losses, state={k: v.detach().clone()
                                         for k, v in module.state_dict().items()})


def _run_case(case: Case, rank: int, world: int) -> Outcome | None:
    graph = build_graph(case.model, case.batch, case.image_size, case.num_classes)
    assignment = {name: ParallelConfig.parse(text) for name, text in case.strategy.items()}
    plan = build_plan(graph, assignment, world)
    comm = Communicator(rank, world, plan.groups())
    model = LayerwiseModel(_fresh_module(case), plan, comm)
    optimizer = _optimizer(case, model.parameters())
    losses = []
    step_bytes: dict = {}
    step_waits: dict = {}
    for inputs, targets in batches(case, graph.input_shape[1]):
        comm.counter.reset()
        comm.clock.reset()
        losses.append(float(model.forward_backward(inputs, targets)))
        step_bytes = comm.counter.reset()
        step_waits = comm.clock.reset().seconds
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad()
    state = model.full_state_dict()
    gathered: list[tuple[dict, dict] | None] = [None] * world
    dist.all_gather_object(gathered, (step_bytes, step_waits))
    if rank != 0:
        return None
    assert state is not None
    return Outcome(losses=losses, state=state,
                   bytes_by_rank=[g[0] if g else {} for g in gathered],
                   waits_by_rank=[g[1] if g else {} for g in gathered])


def _spawned(rank: int, world: int, rendezvous: str, run_case: Callable[..., object],
             cases: Sequence[object], out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=world)
    try:
        outcomes = [run_case(case, rank, world) for case in cases]
        if rank == 0:
            torch.save(outcomes, out)
    finally:
        dist.destroy_process_group()


def spawn_cases(run_case: Callable[..., object], cases: Sequence[object], world: int,
                module: str) -> list:
    """`run_case(case, rank, world)` for every case on `world` gloo processes (one launch:
    starting them costs seconds); rank 0's results. `run_case` lives in `module`, which the
    fork server imports once with torch and layerwise."""
    context = torch_mp.get_context("forkserver")
    context.set_forkserver_preload([__name__, module])
    with tempfile.TemporaryDirectory(prefix="layerwise-test-") as folder:
        out = os.path.join(folder, "outcomes.pt")
        torch_mp.start_processes(_spawned,
                                 args=(world, local_rendezvous(folder), run_case, cases, out),
                                 nprocs=world, join=True, start_method="forkserver")
        return torch.load(Path(out), weights_only=False)


def run_distributed(cases: list[Case], world: int) -> list[Outcome]:
    """Run every case on `world` gloo processes; the outcomes as rank 0 assembled them."""
    return spawn_cases(_run_case, cases, world, __name__)
