"""Local parallelism (docs/research.md: local parallelism) against global backprop, data parallelism
and the pipeline.

    .venv/bin/python benchmarks/bench_local.py          # lenet5, 2 processes, 10 epochs, 3 rounds
    .venv/bin/python benchmarks/bench_local.py --model tiny_cnn --epochs 5 --repeats 1 \
        --keep runs/bench-local

Every run is the real CLI on the prepared digits (prepared first with `python -m
layerwise.tasks.stages.prepare_data` when data/prepared/digits is missing), side by side in this one
invocation, same model, seed, global batch (batch per device x processes) and epochs:

    layerwise train MODEL --strategy S --nproc N --dataset digits --epochs E \\
        --batch-per-device B --out DIR

- `global backprop`: `--strategy data --nproc 1 --batch-per-device B*N`, one process;
- `data`, `pipeline` (skipped with a note when this checkout has no such strategy), `local`
  (greedy) and `local_overlap` (overlapping) on N processes.
Step times come from each run's result.json (`RunResult.step_seconds_median`), validation accuracy
from `layerwise.tasks.validate.validation_accuracy` (model.pt in the plain module, eval mode, the
validation split). Every run is repeated `--repeats` times in rounds (each round runs every strategy
once), so that a burst of other work on the machine lands on all rows alike; a row's step time is
the median over its runs, its accuracy the mean (seeded runs on the CPU repeat it exactly). Printed:
step time, its ratio to global backprop, validation accuracy and its gap to global backprop's.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from layerwise.strategies.training_run import RunResult
from layerwise.tasks.validate import validation_accuracy

LAYERWISE = Path(sys.executable).parent / "layerwise"
DIGITS_META = Path("data/prepared/digits/meta.json")
STRATEGIES = ("data", "pipeline", "local", "local_overlap")


@dataclass(frozen=True)
class Outcome:
    label: str
    processes: int
    step_seconds: float | None = None
    accuracy: float | None = None
    note: str = ""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="lenet5")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-per-device", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="rounds of every run")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the run folders here (default: a temporary folder)")
    return parser.parse_args()


def prepare_digits() -> None:
    if not DIGITS_META.is_file():
        subprocess.run([sys.executable, "-m", "layerwise.tasks.stages.prepare_data"], check=True)


def train(args: argparse.Namespace, label: str, strategy: str, processes: int,
          out: Path) -> Outcome:
    """One `layerwise train` run into `out`; its median step time and validation accuracy."""
    batch = args.batch_per_device * args.nproc // processes  # the same global batch
    command = [str(LAYERWISE), "train", args.model, "--strategy", strategy, "--nproc",
               str(processes), "--dataset", "digits", "--epochs", str(args.epochs),
               "--batch-per-device", str(batch), "--out", str(out)]
    finished = subprocess.run(command, capture_output=True, text=True)
    if finished.returncode != 0:
        lines = [line for line in finished.stderr.splitlines() if line.strip()]
        return Outcome(label, processes, note=lines[-1] if lines else "failed")
    result = RunResult.load(out / "result.json")
    return Outcome(label, processes, result.step_seconds_median, validation_accuracy(out))


def report(outcomes: list[Outcome], args: argparse.Namespace) -> None:
    base = outcomes[0]
    if base.step_seconds is None or base.accuracy is None:
        raise SystemExit(f"global backprop failed: {base.note}")
    table = Table(title=f"{args.model} on digits, {args.epochs} epochs, global batch "
                        f"{args.batch_per_device * args.nproc}")
    for column in ("strategy", "processes", "step ms (median)", "x global backprop",
                   "val accuracy", "gap (points)"):
        table.add_column(column, justify="left" if column == "strategy" else "right")
    for outcome in outcomes:
        if outcome.step_seconds is None or outcome.accuracy is None:
            table.add_row(outcome.label, str(outcome.processes), "-", "-", "-",
                          f"skipped: {outcome.note}")
            continue
        table.add_row(outcome.label, str(outcome.processes),
                      f"{outcome.step_seconds * 1e3:.1f}",
                      f"{outcome.step_seconds / base.step_seconds:.2f}",
                      f"{outcome.accuracy:.2%}",
                      f"{(outcome.accuracy - base.accuracy) * 100:+.1f}")
    Console(width=100).print(table)


def combine(runs: list[Outcome]) -> Outcome:
    """One row from a strategy's runs: median step time, mean accuracy (or the failure)."""
    seconds = [run.step_seconds for run in runs if run.step_seconds is not None]
    accuracies = [run.accuracy for run in runs if run.accuracy is not None]
    if not seconds or not accuracies:
        return runs[0]
    return Outcome(runs[0].label, runs[0].processes, statistics.median(seconds),
                   statistics.fmean(accuracies))


def main() -> None:
    args = parse_args()
    prepare_digits()
    rows = [("global backprop", "data", 1), *((name, name, args.nproc) for name in STRATEGIES)]
    runs: dict[str, list[Outcome]] = {label: [] for label, _, _ in rows}
    with tempfile.TemporaryDirectory(prefix="bench-local-") as temporary:
        folder = args.keep or Path(temporary)
        for repeat in range(args.repeats):
            for label, strategy, processes in rows:
                out = folder / f"{label.replace(' ', '_')}-{repeat + 1}"
                runs[label].append(train(args, label, strategy, processes, out))
    report([combine(runs[label]) for label, _, _ in rows], args)


if __name__ == "__main__":
    main()
