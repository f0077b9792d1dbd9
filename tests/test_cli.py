"""The `layerwise` CLI as a user runs it: output, --json, and one-line errors with exit code 2."""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from layerwise.flows.cli import app
from layerwise.strategies.hardware.cluster import load_cluster, preset_names
from layerwise.strategies.model.graph import build_graph
from layerwise.strategies.model.space import count_configs
from layerwise.strategies.model.zoo import ZOO
from tests.cli_errors import one_line_error

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args))



def test_models_lists_the_zoo():
    result = run("models")
    assert result.exit_code == 0
    for name in ZOO:
        assert name in result.stdout
    assert "25,557,032" in result.stdout  # ResNet-50
    document = json.loads(run("models", "--json").stdout)
    by_name = {m["name"]: m for m in document["models"]}
    assert by_name["vgg16"]["parameters"] == 138_357_544
    assert by_name["inception_v3"]["input_shape"] == [3, 299, 299]


def test_graph_json_reports_layers_and_configuration_counts():
    result = run("graph", "tiny_cnn", "--devices", "4", "--batch", "8", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    graph = build_graph("tiny_cnn", batch=8)
    assert document["structure_hash"] == graph.structure_hash
    assert document["input_shape"] == [8, 3, 32, 32]
    assert [layer["name"] for layer in document["layers"]] == [lay.name for lay in graph.layers]
    for layer, entry in zip(graph.layers, document["layers"], strict=True):
        assert entry["configs"] == count_configs(layer, 4)
        assert entry["output_shape"] == list(layer.output_shape)
        assert entry["inputs"] == list(layer.inputs)
    add = next(entry for entry in document["layers"] if entry["kind"] == "add")
    assert len(add["inputs"]) == 2


def test_graph_table_for_the_demo_shows_every_layer():
    result = run("graph", "vgg16", "--cluster", "h200x16")
    assert result.exit_code == 0, result.output
    assert "16 devices of h200x16" in result.stdout
    assert "512x64x224x224" in result.stdout  # 32 images per device
    assert "classifier_0" in result.stdout and "102,764,544" in result.stdout
    assert "138,357,544 parameters" in result.stdout


def test_graph_of_a_user_model(tmp_path, monkeypatch):
    (tmp_path / "user_cnn.py").write_text(textwrap.dedent("""
        from torch import nn

        def build(num_classes=10, in_channels=3):
            return nn.Sequential(nn.Conv2d(in_channels, 4, 3, padding=1), nn.ReLU(),
                                 nn.Flatten(), nn.Linear(4 * 8 * 8, num_classes))
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    result = run("graph", "user_cnn:build", "--image-size", "8", "--in-channels", "1",
                 "--classes", "3", "--devices", "2", "--json")
    assert result.exit_code == 0, result.output
    layers = json.loads(result.stdout)["layers"]
    assert layers[0]["output_shape"] == [64, 1, 8, 8]
    assert layers[-1]["output_shape"] == [64, 3]


def test_unknown_model_lists_the_zoo():
    one_line_error(run("graph", "resnet51"), "resnet51", "resnet50", "inception_v3",
                          "package.module:factory")


def test_unknown_cluster_lists_presets():
    one_line_error(run("graph", "tiny_cnn", "--cluster", "tpu-pod"), "tpu-pod",
                          *preset_names())


def test_more_devices_than_the_cluster_has():
    one_line_error(run("graph", "tiny_cnn", "--cluster", "k20x8", "--devices", "16"),
                          "k20x8", "8 devices", "--devices is 16")


def test_model_that_does_not_fit_the_image_size():
    one_line_error(run("graph", "vgg16", "--image-size", "8"), "vgg16")


def test_clusters_list_and_show_round_trip(tmp_path):
    result = run("clusters")
    assert result.exit_code == 0
    for name in preset_names():
        assert name in result.stdout
    shown = run("clusters", "show", "k20x8")
    assert shown.exit_code == 0
    path = tmp_path / "mine.yaml"
    path.write_text(shown.stdout)
    assert load_cluster(path) == load_cluster("k20x8")
    from_path = run("graph", "tiny_cnn", "--cluster", str(path), "--json")
    assert json.loads(from_path.stdout)["devices"] == 8


@pytest.mark.parametrize(
    ("edit", "fragments"),
    [
        (lambda doc: doc.update(nodes=0), ("nodes", "must be > 0")),
        (lambda doc: doc["links"]["inter_node"].update(bandwidth=-1),
         ("links.inter_node.bandwidth", "must be > 0")),
        (lambda doc: doc.update(colour="blue"), ("colour", "unknown field")),
        (lambda doc: doc.update(devices_per_node=2),  # the card of 4 no longer fits a node
         ("links.inter_node.shared_by", "must divide 2 (got 4)")),
    ],
)
def test_invalid_cluster_file_names_the_field(tmp_path, edit, fragments):
    document = yaml.safe_load(load_cluster("p100x16-2018").to_yaml())
    edit(document)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(document))
    one_line_error(run("clusters", "show", str(path)), "bad.yaml", *fragments)


def test_malformed_cluster_yaml(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: [unclosed\n")
    one_line_error(run("graph", "tiny_cnn", "--cluster", str(path)), "not valid YAML")


def test_installed_entry_point_exits_2_on_bad_input():
    executable = shutil.which("layerwise", path=str(Path(sys.executable).parent))
    assert executable, "the layerwise console script is not installed"
    help_text = subprocess.run([executable, "--help"], capture_output=True, text=True)
    assert help_text.returncode == 0
    for command in ("models", "graph", "clusters"):
        assert command in help_text.stdout
    failed = subprocess.run([executable, "clusters", "show", "nope"], capture_output=True,
                            text=True)
    assert failed.returncode == 2
    assert failed.stderr.strip().startswith("error: unknown cluster 'nope'")
    assert "Traceback" not in failed.stderr


def test_version_short_help_and_completion_as_a_user_asks_for_them():
    """`--version`, `-h` and shell completion were "No such option"."""
    executable = str(Path(sys.executable).parent / "layerwise")
    version = subprocess.run([executable, "--version"], capture_output=True, text=True)
    assert version.returncode == 0
    assert version.stdout.strip() == f"layerwise {importlib.metadata.version('layerwise')}"
    for argv in (["-h"], ["train", "-h"]):
        short = run(*argv)
        assert short.exit_code == 0 and short.stdout == run(*argv[:-1], "--help").stdout
    # typed in bash: the shell is found among the command's parents wherever the suite runs
    # (`; exit` keeps bash from replacing itself with the command)
    completion = subprocess.run(["bash", "-c", '"$0" --show-completion; exit $?', executable],
                                capture_output=True, text=True)
    assert completion.returncode == 0 and "complete " in completion.stdout, completion.stderr


def _close_stdout() -> None:
    os.close(1)


@pytest.mark.parametrize(("arguments", "fragment", "code"), [
    ({"stdout": "/dev/full"}, "error: cannot write the output: No space left on device", 1),
    ({"preexec_fn": _close_stdout}, "error: standard output is closed", 2),
], ids=["full-disk", "closed"])
def test_output_that_cannot_be_written_is_one_line(arguments, fragment, code):
    """`layerwise models > /dev/full` and `layerwise models >&-` printed tracebacks."""
    with contextlib.ExitStack() as stack:
        if "stdout" in arguments:
            arguments = {"stdout": stack.enter_context(open(arguments["stdout"], "w"))}
        result = subprocess.run([str(Path(sys.executable).parent / "layerwise"), "models"],
                                stderr=subprocess.PIPE, text=True, check=False, **arguments)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == code and len(lines) == 1, result.stderr
    assert lines[0].startswith(fragment)


@pytest.mark.parametrize(("argv", "fragment"), [
    (["train"], "error: Missing argument 'model'; see `layerwise train --help`"),
    (["train", "tiny_cnn", "--nproc", "x"], "error: Invalid value for '--nproc'"),
    (["verify", "tiny_cnn", "--timeout", "nan"], "error: No such option: --timeout"),
], ids=["missing", "wrong-type", "unknown-option"])
def test_a_usage_error_is_one_line_as_every_other_error(argv, fragment):
    """Typer drew these as a box of five lines; the command a user runs says them in one."""
    result = subprocess.run([str(Path(sys.executable).parent / "layerwise"), *argv],
                            capture_output=True, text=True, check=False)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith(fragment) and not result.stdout, lines[0]
