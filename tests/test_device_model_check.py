"""benchmarks/device_model_check.py and host_dispatch.py, the checks a lent GPU runs, work end to
end on a CPU: every tile of the model measured and priced, and a row per op kind; the host's
per-layer and per-op cost measured and written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from layerwise.strategies.cost.profile import tile_plan
from layerwise.strategies.model.graph import build_graph

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "device_model_check.py"
DISPATCH = SCRIPT.parent / "host_dispatch.py"
OVERLAP = SCRIPT.parent / "tile_overlap.py"


def test_tiles_are_timed_alone_and_back_to_back():
    """Every layer's tile on one device, timed alone (the profile's sum) and in one sequence:
    a row per model with both and their ratio."""
    result = subprocess.run(
        [sys.executable, str(OVERLAP), "--device", "cpu", "--models", "tiny_cnn;lenet5",
         "--image-size", "16", "--batch", "4", "--repeats", "5"],
        capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines()[2:]}
    assert set(rows) == {"tiny_cnn", "lenet5"}
    assert rows["lenet5"][0] == "9"  # its layers but the input
    for _, alone, chained, ratio in rows.values():
        a, c, r = float(alone), float(chained), float(ratio)
        assert a > 0 and c > 0
        # the ratio of the unrounded times: within what rounding each to 0.01 ms allows
        assert (a - 0.005) / (c + 0.005) - 0.005 <= r <= (a + 0.005) / max(c - 0.005, 1e-9) + 0.005


def test_the_hosts_floor_is_measured_per_layer_and_per_op(tmp_path):
    """Longer chains of ops take longer: the line through them has a positive slope (the
    cost of one op forward and backward) and intercept (of entering backward once)."""
    out = tmp_path / "host.json"
    result = subprocess.run(
        [sys.executable, str(DISPATCH), "--device", "cpu", "--ops", "1,4,16", "--repeats", "50",
         "--launches", "500", "--out", str(out)],
        capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    document = json.loads(out.read_text())
    chains = document["chain_seconds"]
    assert chains["1"] < chains["4"] < chains["16"]
    assert document["per_op_seconds"] > 0 and document["launch_seconds"] > 0
    assert "per layer (intercept)" in result.stdout


def test_every_tile_is_measured_and_priced_and_each_op_kind_summarised(tmp_path):
    out = tmp_path / "check.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--cluster", "local", "--models",
         "tiny_cnn", "--devices", "2", "--batch-per-device", "4", "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=SCRIPT.parent.parent, check=False)
    assert result.returncode == 0, result.stderr
    document = json.loads(out.read_text())
    assert document["cluster"] == "local"
    graph = build_graph("tiny_cnn", batch=8)
    plan = tile_plan(graph, 2)
    passes = {(row["layer"], row["tile"]) for row in document["tiles"] if row["kind"] != "update"}
    assert passes == {(name, key) for name, tiles in plan.items()
                      if graph.by_name[name].kind != "input" for key in tiles}
    updates = {row["layer"] for row in document["tiles"] if row["kind"] == "update"}
    assert updates == {layer.name for layer in graph.layers if layer.param_count}
    assert all(row["measured"] > 0 for row in document["tiles"])
    kinds = {row["kind"] for row in document["tiles"]}
    assert {"conv+bn", "linear", "update"} <= kinds
    rows = [line.lstrip("│┃ ") for line in result.stdout.splitlines()]
    for kind in kinds:
        assert any(row.startswith(kind + " ") for row in rows), kind
