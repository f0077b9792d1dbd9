"""What a rank pays before its first step, the way it paid it before and the way it pays it now.

    .venv/bin/python benchmarks/bench_rank_start.py                 # 3 rounds
    .venv/bin/python benchmarks/bench_rank_start.py --rounds 5 --model alexnet --nproc 4

Three costs, each side by side in this one invocation, each in fresh Python processes so that
nothing is cached between them:

- the first SGD step of a process: torch.optim.SGD (whose first use imports torch._dynamo)
  against strategies/sgd.py's Sgd (torch's functional sgd, the same arithmetic);
- building the seeded float64 module of a strategy after the first (`layerwise verify` trains
  every strategy in one launch): `build_seeded` again against `InitialModules.build`, which
  copies the first build and restores the generator state it left;
- a whole launch of `--nproc` ranks training tiny_cnn for one step (wall time, and the CPU
  time of every process of it): torchrun starting a fresh interpreter per rank against
  layerwise's agent (strategies/jobs/agent.py), whose ranks are forks of it.

A round runs both variants of each; a row's time is the median over rounds. Printed: both
times and before / now.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from layerwise.strategies.hardware.rendezvous import loopback_environment
from layerwise.strategies.jobs.launch import AGENT_MODULE

FIRST_STEP = """
import json, time
started = time.perf_counter()
import torch
from torch import nn
model = nn.Linear(64, 10)
model(torch.randn(8, 64)).sum().backward()
imported = time.perf_counter()
if {library}:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
else:
    from layerwise.strategies.sgd import Sgd
    optimizer = Sgd(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.0)
optimizer.step()
print(json.dumps(time.perf_counter() - imported))
"""

NEXT_MODULE = """
import json, time
from layerwise.strategies.runtime.initial_module import InitialModules, build_seeded
from layerwise.strategies.training_run import TrainSettings
settings = TrainSettings(model={model!r}, strategy="data", nproc=2, nnodes=1, cluster="local",
                         profile=None, dataset="synthetic", data_root="data/prepared",
                         batch_per_device=4, image_size=32, classes=10, in_channels=3,
                         lr=0.01, momentum=0.9, weight_decay=0.0, seed=0, dtype="float64")
modules = InitialModules()
modules.build(settings)  # the launch's first strategy
started = time.perf_counter()
modules.build(settings) if {cached} else build_seeded(settings)
print(json.dumps(time.perf_counter() - started))
"""


def _seconds(script: str) -> float:
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True)
    return float(json.loads(done.stdout.strip().splitlines()[-1]))


def _launch_seconds(launcher: str, run: Path, nproc: int) -> tuple[float, float]:
    """Wall and CPU seconds (every process of the launch) of one launch by `launcher` of
    the ranks of the prepared run folder `run`, one step each."""
    with tempfile.TemporaryDirectory() as folder:
        environment = {**os.environ, "TMPDIR": folder, **loopback_environment(Path(folder))}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", launcher, "--nproc-per-node", str(nproc),
                        "--max-restarts", "0", "-m", "layerwise.strategies.runtime.worker",
                        "--out", str(run), "--steps", "1", "--no-checkpoint"],
                       env=environment, capture_output=True, check=True)
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def _prepared_run(folder: Path, nproc: int) -> Path:
    """A run folder `layerwise train` wrote (strategy, settings, graph) for the launches."""
    run = folder / "run"
    subprocess.run([str(Path(sys.executable).with_name("layerwise")), "train", "tiny_cnn",
                    "--strategy", "data", "--nproc", str(nproc), "--image-size", "8",
                    "--steps", "1", "--out", str(run)], capture_output=True, check=True)
    return run


def _launch_rows(rounds: int, nproc: int) -> list[tuple[str, float, float]]:
    launchers = {"before": "torch.distributed.run", "now": AGENT_MODULE}
    walls: dict[str, list[float]] = {key: [] for key in launchers}
    cpus: dict[str, list[float]] = {key: [] for key in launchers}
    with tempfile.TemporaryDirectory() as folder:
        run = _prepared_run(Path(folder), nproc)
        for _ in range(rounds):
            for key, launcher in launchers.items():
                wall, cpu = _launch_seconds(launcher, run, nproc)
                walls[key].append(wall)
                cpus[key].append(cpu)
    return [(f"a launch of {nproc} ranks, {what}", statistics.median(values["before"]),
             statistics.median(values["now"]))
            for what, values in (("wall", walls), ("CPU of its processes", cpus))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="alexnet")
    parser.add_argument("--nproc", type=int, default=2, help="ranks of the launch rows")
    args = parser.parse_args()
    cases = {
        "first SGD step of a process": (FIRST_STEP.format(library=True),
                                        FIRST_STEP.format(library=False)),
        f"{args.model} float64 module, a later strategy": (
            NEXT_MODULE.format(model=args.model, cached=False),
            NEXT_MODULE.format(model=args.model, cached=True)),
    }
    table = Table("cost", "before s", "now s", "before / now")
    for name, (before, now) in cases.items():
        times: dict[str, list[float]] = {"before": [], "now": []}
        for _ in range(args.rounds):
            times["before"].append(_seconds(before))
            times["now"].append(_seconds(now))
        old, new = (statistics.median(times[key]) for key in ("before", "now"))
        table.add_row(name, f"{old:.3f}", f"{new:.3f}", f"{old / new:.1f}x")
    for name, old, new in _launch_rows(args.rounds, args.nproc):
        table.add_row(name, f"{old:.3f}", f"{new:.3f}", f"{old / new:.1f}x")
    Console().print(table)


if __name__ == "__main__":
    main()
