"""OWT's hand-off schemes measured against their predictions (strategies/schedules/owt).

    .venv/bin/python benchmarks/bench_owt_schemes.py          # alexnet at 64 px, 2 processes
    .venv/bin/python benchmarks/bench_owt_schemes.py --model wide_fc --image-size 32 \\
        --batch-per-device 32 --repeats 5

First a calibration of this machine's links and a profile of the model's tiles with one
profiler per process at once, as the benchmark flow takes them; then every scheme is the real
CLI on synthetic data, side by side in this one invocation:

    layerwise train MODEL --strategy owt_a|owt_b|owt_c --nproc N --steps K \\
        --batch-per-device B --image-size PX --cluster CALIBRATION --profile PROFILE --out DIR

Each round runs every scheme once, so that a burst of other work on the machine lands on all of
them alike. A scheme's step time is the median over its rounds of each run's median step
(`RunResult.step_seconds_median`); its prediction is the run's (`predicted_step_seconds`: the
OWT step model on that calibration and profile, schemes b and c at K passes of the profiled
pass tile). Printed per scheme: measured and predicted ms, measured / predicted, and each
scheme's step over owt_a's, measured and predicted: what a user choosing between the schemes
reads from the predictions.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from layerwise.strategies.training_run import RunResult

LAYERWISE = Path(sys.executable).parent / "layerwise"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="alexnet")
    parser.add_argument("--schemes", default="owt_a,owt_b,owt_c")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch-per-device", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=64,
                        help="AlexNet at 64 px keeps its 58M weights at a CPU's pace")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of every scheme")
    return parser.parse_args()


def layerwise(*arguments: str) -> None:
    """One CLI command; its error line and exit on failure."""
    finished = subprocess.run([str(LAYERWISE), *arguments], capture_output=True, text=True)
    if finished.returncode != 0:
        sys.exit(f"layerwise {' '.join(arguments)} failed: {finished.stderr.strip()}")


def main() -> None:
    args = parse_args()
    schemes = args.schemes.split(",")
    shape = ("--batch-per-device", str(args.batch_per_device), "--image-size",
             str(args.image_size))
    measured: dict[str, list[float]] = {scheme: [] for scheme in schemes}
    predicted: dict[str, list[float]] = {scheme: [] for scheme in schemes}
    console = Console()
    with tempfile.TemporaryDirectory() as folder, console.status("calibrating") as status:
        cluster, profile = Path(folder, "cluster.yaml"), Path(folder, "profile.json")
        layerwise("calibrate", "--nproc", str(args.nproc), "--out", str(cluster))
        status.update("profiling")
        layerwise("profile", args.model, "--devices", str(args.nproc), *shape, "--processes",
                  str(args.nproc), "--out", str(profile))
        for round_ in range(args.repeats):
            for scheme in schemes:
                status.update(f"round {round_ + 1}/{args.repeats}: {scheme}")
                out = Path(folder, f"{scheme}-{round_}")
                layerwise("train", args.model, "--strategy", scheme, "--nproc", str(args.nproc),
                          "--steps", str(args.steps), *shape, "--cluster", str(cluster),
                          "--profile", str(profile), "--out", str(out))
                result = RunResult.load(out / "result.json")
                measured[scheme].append(result.step_seconds_median)
                predicted[scheme].append(result.predicted_step_seconds)
    table = Table(title=f"{args.model}, {args.nproc} processes, {args.batch_per_device} samples "
                        f"each at {args.image_size} px, median of {args.repeats} rounds of "
                        f"{args.steps} steps")
    for column in ("scheme", "measured ms", "predicted ms", "measured / predicted",
                   "/ owt_a measured", "/ owt_a predicted"):
        table.add_column(column, justify="left" if column == "scheme" else "right")
    step = {scheme: statistics.median(measured[scheme]) for scheme in schemes}
    guess = {scheme: statistics.median(predicted[scheme]) for scheme in schemes}
    first = schemes[0]
    for scheme in schemes:
        table.add_row(scheme, f"{step[scheme] * 1e3:.1f}", f"{guess[scheme] * 1e3:.1f}",
                      f"{step[scheme] / guess[scheme]:.2f}", f"{step[scheme] / step[first]:.2f}",
                      f"{guess[scheme] / guess[first]:.2f}")
    console.print(table)


if __name__ == "__main__":
    main()
