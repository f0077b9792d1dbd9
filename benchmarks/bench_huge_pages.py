"""Training steps with torch's huge pages off and on (strategies/processes/huge_pages.py).

    .venv/bin/python benchmarks/bench_huge_pages.py       # alexnet, resnet18, wide_fc; 3 rounds
    .venv/bin/python benchmarks/bench_huge_pages.py --models alexnet --strategies data \\
        --repeats 5

Every run is the real CLI on synthetic data, side by side in this one invocation:

    THP_MEM_ALLOC_ENABLE=0|1 layerwise train MODEL --strategy S --nproc N --steps K \\
        --batch-per-device B --image-size PX --out DIR

Each round runs every (model, strategy) with huge pages off and then on, so that a burst of
other work on the machine lands on both alike. A row's step time is the median over its rounds
of each run's median step (`RunResult.step_seconds_median`). Printed: both step times and
off / on, the speed-up the launcher's default gives.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from layerwise.strategies.processes.huge_pages import HUGE_PAGES_VARIABLE, kernel_offers_huge_pages
from layerwise.strategies.training_run import RunResult

LAYERWISE = Path(sys.executable).parent / "layerwise"
# input size per model: AlexNet at 64 px keeps its 58M weights (the FC layers' size does not
# depend on the input) at a CPU's pace
IMAGE_SIZE = {"alexnet": 64, "resnet18": 32, "wide_fc": 8}
SETTINGS = {"off": "0", "on": "1"}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="alexnet,resnet18,wide_fc")
    parser.add_argument("--strategies", default="data,owt")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch-per-device", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3, help="rounds of every run")
    return parser.parse_args()


def step_seconds(args: argparse.Namespace, model: str, strategy: str, setting: str,
                 out: Path) -> float:
    """One `layerwise train` run with huge pages `setting`; its median step time."""
    command = [str(LAYERWISE), "train", model, "--strategy", strategy, "--nproc",
               str(args.nproc), "--steps", str(args.steps), "--batch-per-device",
               str(args.batch_per_device), "--image-size", str(IMAGE_SIZE.get(model, 32)),
               "--out", str(out)]
    environment = {**os.environ, HUGE_PAGES_VARIABLE: SETTINGS[setting]}
    finished = subprocess.run(command, capture_output=True, text=True, env=environment)
    if finished.returncode != 0:
        sys.exit(f"{' '.join(command)} failed: {finished.stderr.strip()}")
    return RunResult.load(out / "result.json").step_seconds_median


def main() -> None:
    args = parse_args()
    if not kernel_offers_huge_pages():
        sys.exit("this kernel offers no transparent huge pages: nothing to compare")
    rows = [(model, strategy) for model in args.models.split(",")
            for strategy in args.strategies.split(",")]
    times: dict[tuple[str, str, str], list[float]] = {}
    console = Console()
    with tempfile.TemporaryDirectory() as folder, console.status("training") as status:
        for round_ in range(args.repeats):
            for model, strategy in rows:
                for setting in SETTINGS:
                    status.update(f"round {round_ + 1}/{args.repeats}: {model} {strategy} "
                                  f"huge pages {setting}")
                    out = Path(folder) / f"{model}-{strategy}-{setting}-{round_}"
                    times.setdefault((model, strategy, setting), []).append(
                        step_seconds(args, model, strategy, setting, out))
    table = Table(title=f"{args.nproc} processes, {args.batch_per_device} samples each, "
                        f"median of {args.repeats} rounds of {args.steps} steps")
    for column in ("model", "strategy", "off ms", "on ms", "off / on"):
        table.add_column(column, justify="left" if column in ("model", "strategy") else "right")
    for model, strategy in rows:
        off, on = (statistics.median(times[(model, strategy, setting)])
                   for setting in SETTINGS)
        table.add_row(model, strategy, f"{off * 1e3:.1f}", f"{on * 1e3:.1f}", f"{off / on:.2f}")
    console.print(table)


if __name__ == "__main__":
    main()
