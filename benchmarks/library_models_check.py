"""Model libraries' own networks, as users pass them: traced, searched, proven exact.

    python benchmarks/library_models_check.py --out torchvision.json     # one per CNN family
    python benchmarks/library_models_check.py --library monai --out monai.json
    python benchmarks/library_models_check.py --builders "resnet50;vit_b_16" --nproc 2

Neither torchvision nor MONAI is a dependency of layerwise, and torchvision's wheels are built
for the CUDA build of torch (no CPU wheel exists for torch 2.13), so this runs in a Python
that has them; that build runs on a CPU. On the development machine (about 5 GB, minutes):

    python3 -m venv /tmp/tv && /tmp/tv/bin/pip --isolated install \\
        --index-url https://pypi.org/simple torch==2.13.0 torchvision==0.28.0 monai==1.6.1
    echo "import site; site.addsitedir('$PWD/.venv/lib/python3.11/site-packages')" \\
        > /tmp/tv/lib/python3.11/site-packages/zz_layerwise.pth
    /tmp/tv/bin/python benchmarks/library_models_check.py

(a GPU machine's own Python usually has torchvision already). `--library torchvision` takes
torchvision's classification builders (`torchvision.models:NAME`, 10 classes, --image-size);
`--library monai` MONAI's UNet, BasicUNet and SegResNet in 2-d and 3-d as MONAI builds them
(`monai.networks.nets:UNet(spatial_dims=3, ...)`), scoring every position and trained on a label
per position (the generated `segments` dataset). For each network it counts the parameters of the
library's own module and checks the traced graph's count against it, then runs `layerwise
verify` (float64, gloo processes) on the searched plan and on `spatial` (every layer split
along its spatial dims as far as its ops allow) at each of --nproc, each against one process,
with data parallelism beside them: it differs from one process only in the order of its sums,
so its difference is what rounding alone reaches on that network (small maps under BatchNorm
amplify it). It prints one row per network (parameters, the layers held whole, each
strategy's largest difference from one process over the process counts, the verdict at
verify's own 1e-10, seconds) and writes them as JSON to --out. A network layerwise refuses
gets the refusal's one line instead: that line is the result.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import NamedTuple

from rich.console import Console
from rich.table import Table
from torch import nn

from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.files.atomic import write_atomic
from layerwise.strategies.files.locations import safe_name
from layerwise.strategies.model.factory_arguments import split_reference
from layerwise.strategies.model.graph import build_graph

# the smallest classification builder of each family torchvision has
TORCHVISION = ("alexnet", "convnext_tiny", "densenet121", "efficientnet_b0", "efficientnet_v2_s",
            "googlenet(aux_logits=False, init_weights=True)",
            "inception_v3(aux_logits=False, init_weights=True)", "mnasnet0_5", "mobilenet_v2",
            "mobilenet_v3_small",
            "regnet_x_400mf", "regnet_y_400mf", "resnet18", "resnext50_32x4d",
            "shufflenet_v2_x0_5", "squeezenet1_0", "vgg11", "wide_resnet50_2", "vit_b_16",
            "swin_t", "maxvit_t")
# MONAI's segmentation networks, small enough for float64 on 2 cores, and the input of each
MONAI = tuple((f"{network}(spatial_dims={dims}, in_channels=1, out_channels=3, {options})",
               (1, *(32,) * dims))
              for network, options in (("UNet", "channels=(8, 16, 32), strides=(2, 2)"),
                                       ("BasicUNet", "features=(8, 8, 16, 32, 64, 8)"),
                                       ("SegResNet", "init_filters=8"))
              for dims in (2, 3))
# the least input side their strides and pools reach with at least one position
MIN_SIDE = {"inception_v3": 80, "vit_b_16": 224, "maxvit_t": 224}
CLASSES = 10
STRATEGIES = ("data", "layerwise", "spatial")


class Network(NamedTuple):
    """One row's network: its name, the reference layerwise takes, the library's own module,
    the input (channels and spatial sizes) and the dataset it trains on."""

    name: str
    reference: str
    library_module: Callable[[], nn.Module]
    input_shape: tuple[int, ...]
    dataset: str = "synthetic"


def networks(library: str, builders: str | None, side: int) -> list[Network]:
    """The networks to check: every entry of `library`, or the `;`-separated `builders`."""
    if library == "monai":
        chosen = [(entry, shape) for entry, shape in MONAI
                  if builders is None or entry.split("(")[0] in builders.split(";")]
        return [Network(entry, f"monai.networks.nets:{entry}", _monai(entry), shape,
                        "segments") for entry, shape in chosen]
    names = TORCHVISION if builders is None else tuple(builders.split(";"))
    return [Network(name, f"torchvision.models:{name}", _torchvision(name),
                    (3, *(max(side, MIN_SIDE.get(name.split("(")[0], 0)),) * 2))
            for name in (name.strip() for name in names)]


def _torchvision(builder: str) -> Callable[[], nn.Module]:
    name, given = split_reference(builder)
    return lambda: getattr(importlib.import_module("torchvision.models"), name)(
        **{"num_classes": CLASSES, **given})


def _monai(entry: str) -> Callable[[], nn.Module]:
    network, given = split_reference(f"monai.networks.nets:{entry}")
    return lambda: getattr(importlib.import_module("monai.networks.nets"),
                           network.partition(":")[2])(**given)


def check(network: Network, args: argparse.Namespace, folder: Path) -> dict[str, object]:
    """One network's row: its parameters both ways, held layers, each verify's verdict."""
    shape = ",".join(map(str, network.input_shape))
    row: dict[str, object] = {"builder": network.name, "input_shape": shape}
    started = time.perf_counter()
    row["library_parameters"] = sum(p.numel() for p in network.library_module().parameters())
    try:
        graph = build_graph(network.reference, batch=2, image_size=network.input_shape[1:],
                            num_classes=CLASSES, in_channels=network.input_shape[0])
    except LayerwiseError as error:
        row.update(refused=str(error), seconds=time.perf_counter() - started)
        return row
    row.update(layerwise_parameters=graph.param_count, layers=len(graph.layers),
               held=graph.held_notes)
    classes = graph.by_name[graph.outputs[0]].output_shape[1]  # MONAI's out_channels
    runs = {}
    for nproc in args.nproc:
        command = [sys.executable, "-m", "layerwise", "verify", network.reference,
                   "--strategy", ",".join(STRATEGIES), "--nproc", str(nproc),
                   "--input-shape", shape, "--classes", str(classes), "--dataset",
                   network.dataset, "--steps",
                   str(args.steps), "--out", str(folder / f"{safe_name(network.name)}-{nproc}"),
                   "--json"]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        try:  # a plan that is not exact exits 1 with its report
            report = json.loads(done.stdout)
        except json.JSONDecodeError:
            runs[nproc] = {"error": " ".join(done.stderr.split())[-600:] or "no output"}
            continue
        runs[nproc] = {d["strategy"]: {"exact": d["exact"], "largest": max(
            d["max_loss_difference"], d["max_parameter_difference"])}
            for d in report["divergences"]}
    row.update(verify=runs, seconds=time.perf_counter() - started)
    return row


def verdict(row: dict[str, object]) -> str:
    if "refused" in row:
        return "refused"
    runs = row["verify"]
    assert isinstance(runs, dict)
    if any("error" in run for run in runs.values()):
        return "error"
    return "exact" if all(strategy["exact"] for run in runs.values()
                          for strategy in run.values()) else "DIVERGES"


def table(rows: list[dict[str, object]], nprocs: list[int]) -> Table:
    out = Table(title=f"float64 against one process on {', '.join(map(str, nprocs))} "
                      "processes")
    for column in ("network", "input", "parameters", "same count", "held", *STRATEGIES,
                   "verdict", "s"):
        out.add_column(column, justify="left" if column in ("network", "verdict") else "right")
    for row in rows:
        runs = row.get("verify", {})
        assert isinstance(runs, dict)

        def largest(strategy: str, runs: dict = runs) -> str:
            values = [run[strategy]["largest"] for run in runs.values() if strategy in run]
            return f"{max(values):.1e}" if values else "-"

        out.add_row(
            str(row["builder"]), str(row["input_shape"]), f"{row['library_parameters']:,}",
            "-" if "refused" in row else
            str(row["layerwise_parameters"] == row["library_parameters"]),
            "-" if "refused" in row else str(len(row["held"])),  # type: ignore[arg-type]
            *(largest(strategy) for strategy in STRATEGIES), verdict(row),
            f"{float(row['seconds']):.0f}")  # type: ignore[arg-type]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--library", choices=("torchvision", "monai"), default="torchvision")
    parser.add_argument("--builders", default=None,
                        help="the library's networks (with arguments), ';'-separated")
    parser.add_argument("--nproc", default="2,4", help="process counts, comma-separated")
    parser.add_argument("--image-size", type=int, default=64, help="torchvision's input side")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="every row as JSON")
    args = parser.parse_args(argv)
    args.nproc = [int(n) for n in args.nproc.split(",")]
    console = Console()
    try:
        library = importlib.import_module(args.library)
    except ImportError:
        console.print(f"{args.library} is not installed in this Python: see this script's "
                      "docstring for a Python that has it", highlight=False)
        return 2
    console.print(f"{args.library} {library.__version__}", highlight=False)
    rows = []
    with TemporaryDirectory(prefix="layerwise-library-") as folder:
        for network in networks(args.library, args.builders, args.image_size):
            row = check(network, args, Path(folder))
            console.print(f"{network.name}: {verdict(row)} in {float(row['seconds']):.0f} s"
                          + (f" ({row['refused']})" if "refused" in row else ""),
                          highlight=False)
            rows.append(row)
    console.print(table(rows, args.nproc))
    if args.out is not None:
        write_atomic(args.out, json.dumps({args.library: library.__version__, "rows": rows},
                                          indent=1))
    return 0 if all(verdict(row) in ("exact", "refused") for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
