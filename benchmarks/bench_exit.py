"""How long a layerwise process takes to end, with its objects frozen at exit and without
(strategies/processes/quick_exit.py).

    .venv/bin/python benchmarks/bench_exit.py              # 5 rounds
    .venv/bin/python benchmarks/bench_exit.py --rounds 9

Each round starts a fresh Python that imports what `layerwise run`'s process holds by the time
it ends (torch, MLflow, Prefect, the benchmark flow and its stages, and torch._dynamo, which
torch's meta tensors load when a graph is traced), prints the time, and exits: once plain and
once with `freeze_at_exit()`, one after the other, so that a burst of other work on the machine
lands on both alike. A process's exit is from that printed time to the moment the parent sees it
end. Printed: the median over the rounds of each, and plain / frozen.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from rich.console import Console
from rich.table import Table

CHILD = """
import sys, time
import torch, torch._dynamo, mlflow, prefect
import layerwise.flows.benchmark
if sys.argv[1] == "frozen":
    from layerwise.strategies.processes.quick_exit import freeze_at_exit
    freeze_at_exit()
print(time.time(), flush=True)
"""
MODES = ("plain", "frozen")


def exit_seconds(mode: str) -> float:
    """Seconds from the child's last line to its end."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, mode], stdout=subprocess.PIPE,
                             text=True)
    assert child.stdout is not None
    printed = float(child.stdout.readline())
    if child.wait() != 0:
        raise SystemExit(f"the {mode} child failed with exit code {child.returncode}")
    return time.time() - printed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    rounds = parser.parse_args().rounds
    seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(rounds):
        for mode in MODES:
            seconds[mode].append(exit_seconds(mode))
    table = Table(title=f"process exit after importing the flow, median of {rounds} rounds")
    for column in ("plain s", "frozen s", "plain / frozen"):
        table.add_column(column, justify="right")
    plain, frozen = (statistics.median(seconds[mode]) for mode in MODES)
    table.add_row(f"{plain:.2f}", f"{frozen:.2f}", f"{plain / frozen:.1f}x")
    Console().print(table)


if __name__ == "__main__":
    main()
