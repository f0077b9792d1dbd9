"""benchmarks/device_model_check.py, the check a lent GPU runs, works end to end on a CPU: every
tile of the model measured and priced, and a row per op kind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from layerwise.strategies.cost.profile import tile_plan
from layerwise.strategies.model.graph import build_graph

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "device_model_check.py"


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
