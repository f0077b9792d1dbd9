"""Hostile and careless input to every command: one line, exit code 2, nothing written.

One table of command lines, each with a fragment of the one line it must print. The files they
name are built once in a workspace (YAML alias bombs, 100,000-deep documents, corrupt
checkpoints and datasets, paths that cannot be written); each command runs in-process in that
workspace, which must be exactly as it was afterwards.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sqlite3
import sys
import tempfile
import zipfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

from layerwise.flows.cli import app
from layerwise.flows.cli.run import embedded_environment
from layerwise.strategies.files.locations import CHECKPOINT_FILE, LOCK_FILE, SETTINGS_FILE
from layerwise.strategies.hardware.cluster import load_cluster
from layerwise.strategies.hardware.host_memory import MAX_PROCESSES_PER_CORE
from layerwise.strategies.jobs.job import new_job
from layerwise.strategies.jobs.launch import write_run_folder
from layerwise.strategies.jobs.named_strategies import strategy_by_name
from layerwise.strategies.jobs.options import TrainOptions
from layerwise.strategies.jobs.pricing import cost_model
from layerwise.strategies.model.graph import build_graph
from layerwise.strategies.model.zoo import build_model
from layerwise.strategies.runtime.checkpoint import SCHEMA_VERSION, sealed
from layerwise.strategies.runtime.engine_protocol import MODEL_STATE_KEY
from layerwise.strategies.schedules.pipeline.planner import optimal_pipeline, plan_strategy
from layerwise.tasks.stages import prepare_data

DEEP = 100_000
# A "billion laughs": nine levels of nine aliases of the level below, 861 bytes as a file
_LEVELS = "abcdefghi"
BOMB_LINES = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]'] + [
    f"{this}: &{this} [{','.join(f'*{below}' for _ in range(9))}]"
    for below, this in zip(_LEVELS, _LEVELS[1:], strict=False)]
BOMB = "\n".join(BOMB_LINES) + "\n"
INLINE_BOMB = "[" + ", ".join(  # the same bomb as one YAML flow value
    ["&a [lol,lol,lol,lol,lol,lol,lol,lol,lol]"]
    + [f"&{this} [{','.join(f'*{below}' for _ in range(9))}]"
       for below, this in zip(_LEVELS, _LEVELS[1:], strict=False)]) + "]"
TRAIN = ("train", "tiny_cnn", "--strategy", "data", "--nproc", "1")
SEARCH = ("search", "tiny_cnn", "--devices", "2", "--analytic")
PREPARE = "layerwise.tasks.stages.prepare_data"
TOO_MANY = str(MAX_PROCESSES_PER_CORE * (os.cpu_count() or 1) + 1)  # processes no run may start
PRESETS = Path(__file__).resolve().parents[1] / "strategies" / "hardware" / "clusters"
TRAIN_8 = ("train", "tiny_cnn", "--image-size", "8", "--batch-per-device", "8")


class Payload:
    """Pickled into a checkpoint by reference to this module: a global torch's weights-only
    loader must refuse."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("unpickled",))


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _write_npz(path: Path, **arrays: np.ndarray) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        for key, value in arrays.items():
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, value, allow_pickle=True)
            archive.writestr(f"{key}.npy", buffer.getvalue())


def _prepared(root: Path, name: str, train: bytes) -> None:
    folder = root / "data" / "prepared" / name
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text('{"image_size": 8, "classes": 10, "channels": 3}')
    (folder / "train.npz").write_bytes(train)
    (folder / "val.npz").write_bytes(train)


def _run_folder(root: Path, name: str, checkpoint: bytes | None) -> None:
    """A run folder as `layerwise train` writes it, with `checkpoint` as its checkpoint."""
    options = TrainOptions.given(nproc=1, image_size=8)
    with new_job("tiny_cnn", "data", options, root / "runs" / name, analytic=True) as job:
        write_run_folder(job)
        if checkpoint is not None:
            (job.out / CHECKPOINT_FILE).write_bytes(checkpoint)


def _strategy_files(root: Path) -> None:
    """Scheduled strategies for tiny_cnn planned on 2 processes, and pipelines edited by hand."""
    graph = build_graph("tiny_cnn", batch=16, image_size=8)
    cost = cost_model(graph, "local", 2, None, True)
    for name in ("owt_a", "local"):
        strategy_by_name(name, cost).save(root / f"{name}-2.json")
    data = json.loads(strategy_by_name("data", cost).model_dump_json())
    (root / "escape.json").write_text(json.dumps({**data, "name": "\x1b]0;pwned\x07data"}))
    pipeline = plan_strategy(optimal_pipeline(cost, stages=2, micro_batches=2), graph)
    for name, update in {"micro-3": {"micro_batches": 3},
                         "swapped": {"stages": tuple(
                             stage.model_copy(update={"devices": (1 - index,)})
                             for index, stage in enumerate(pipeline.execution.stages))}}.items():
        execution = pipeline.execution.model_copy(update=update)
        pipeline.model_copy(update={"execution": execution}).save(root / f"pipeline-{name}.json")


def _checkpoint(payload: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bad-input")
    files = {
        "bomb.yaml": BOMB,
        "bomb-config.yaml": BOMB + "name: *i\n",
        "bomb-params.yaml": BOMB + "prepare: {dataset: digits}\n",
        "bomb-summary.yaml": BOMB + "name: x\nlayers: *i\n",
        "self.yaml": "name: &n [1, *n]\n",
        "big.yaml": "# padding\n" * ((1 << 20) // 10 + 1),
        "deep.yaml": _nested(DEEP),
        "deep-block.yaml": "".join("  " * level + "-\n" for level in range(100)),
        "deep.json": _nested(DEEP),
        "deep-params.yaml": f"prepare: {_nested(DEEP)}\n",
        "params-list.yaml": "- prepare\n- dataset: digits\n",
        "params-digits.yaml": "prepare: {dataset: digits, image_size: 8}\n",
        "params-huge.yaml": "prepare: {dataset: digits, image_size: 100000}\n",
        "afile": "a file, not a folder\n",
    }
    for name, text in files.items():
        (root / name).write_text(text)
    (root / "adir").mkdir()
    _prepared(root, "truncated", _checkpoint({"x": torch.zeros(64)})[:100])
    with io.BytesIO() as buffer:
        _write_npz(buffer, x=np.array([object()] * 4, dtype=object), y=np.zeros(4, np.int64))
        _prepared(root, "objects", buffer.getvalue())
    for name, arrays in {"shapes": {"x": np.zeros((4, 1, 8, 8)), "y": np.zeros(4, np.int64)},
                         "labels": {"x": np.zeros((4, 3, 8, 8)), "y": np.arange(4) * 5}}.items():
        with io.BytesIO() as buffer:
            np.savez(buffer, **arrays)
            _prepared(root, name, buffer.getvalue())
    _prepared(root, "deepmeta", b"")
    (root / "data" / "prepared" / "deepmeta" / "meta.json").write_text(_nested(DEEP))
    sound = {"schema_version": SCHEMA_VERSION, "step": 3, "engine": {}, "rng": torch.zeros(2),
             "cuda_rng": None, "steps": []}
    good = _checkpoint(sound)
    for name, checkpoint in {
        "truncated": good[: len(good) // 2], "garbage": os.urandom(4096), "empty": b"",
        "pickle": _checkpoint({"schema_version": SCHEMA_VERSION, "step": 3, "engine": Payload()}),
        "list": _checkpoint([1, 2, 3]),
        "records": _checkpoint({"schema_version": SCHEMA_VERSION, "step": 3, "engine": {},
                                "rng": torch.zeros(2), "cuda_rng": None, "steps": [{}]}),
        # sound checkpoints of another model, and of tiny_cnn trained in float64 (`verify`)
        "othermodel": _checkpoint(sealed({**sound, "engine": {
            MODEL_STATE_KEY: build_model("lenet5").state_dict()}})),
        "float64": _checkpoint(sealed({**sound, "engine": {MODEL_STATE_KEY: {
            name: tensor.double() if tensor.is_floating_point() else tensor
            for name, tensor in build_model("tiny_cnn", image_size=8).state_dict().items()}}})),
    }.items():
        _run_folder(root, f"ckpt-{name}", checkpoint)
    _strategy_files(root)
    preset = PRESETS / "local.yaml"
    (root / "escape.yaml").write_text(  # a window-title change and a colour in its name
        preset.read_text().replace("name: local", 'name: "\\e]0;pwned\\a\\e[31mlocal"', 1))
    (root / "twice.yaml").write_text(preset.read_text() + "name: another\n")  # kept the last
    (root / "kept.json").write_text("{}")  # what a --save through a link would replace
    (root / "huge-number.yaml").write_text(preset.read_text().replace(
        "nodes: 1", f"nodes: {'9' * 5000}", 1))
    (root / "huge-number.json").write_text(f'{{"schema_version": {"9" * 5000}}}')
    (root / "exiting_factory.py").write_text("import sys\n\ndef make(**kwargs):\n"
                                             "    sys.exit(3)\n")
    (root / "exiting_module.py").write_text("import sys\n\nsys.exit(0)\n")
    (root / "link.json").symlink_to(root / "kept.json")
    os.mkfifo(root / "fifo.yaml")  # no writer ever comes: a read of it waited for good
    _run_folder(root, "deep-settings", None)
    (root / "runs" / "deep-settings" / SETTINGS_FILE).write_text(_nested(DEEP))
    assert len(BOMB.encode()) < 400 and load_cluster("local")  # the bomb is a small file
    return root


# (command line, fragment of its one line). PREPARE runs `python -m
# layerwise.tasks.stages.prepare_data`'s main.
CASES: list[tuple[tuple[str, ...], str]] = [
    # Rich markup and emoji codes in user text are printed as written
    (("graph", "[/foo]"), "model '[/foo]'"),
    (("graph", "a:b:c"), "'a:b:c'"),
    (("graph", "tiny_cnn", "--cluster", "[bold]x.yaml"), "cluster file [bold]x.yaml"),
    # an empty name is no name, not the default
    (("reproduce", "optcnn", "--cluster", ""), "unknown cluster ''"),
    (("reproduce", "optcnn", "--batch-norm", ""), "--batch-norm"),
    # a YAML alias bomb wherever a YAML file or value is read
    (("clusters", "show", "bomb.yaml"), "aliases expand to more than 1,000,000 values"),
    (("graph", "tiny_cnn", "--cluster", "bomb.yaml"), "cluster file bomb.yaml is refused"),
    (("graph", "tiny_cnn", "--cluster", "fifo.yaml"), "is not a regular file (a pipe"),
    (("run", "--config", "fifo.yaml"), "is not a regular file (a pipe"),
    ((*SEARCH, "--cluster", "bomb.yaml"), "aliases expand"),
    (("oracle", "tiny_cnn", "--platform", "bomb.yaml"), "aliases expand"),
    ((*TRAIN, "--cluster", "bomb.yaml"), "aliases expand"),
    (("run", "--config", "bomb-config.yaml"), "config bomb-config.yaml is refused"),
    (("run", "--set", "cluster=bomb.yaml"), "aliases expand"),
    (("run", "--set", f"name={INLINE_BOMB}"), "aliases expand"),
    (("oracle", "bomb-summary.yaml"), "model summary bomb-summary.yaml is refused"),
    ((PREPARE, "--params", "bomb-params.yaml"), "aliases expand"),
    (("clusters", "show", "self.yaml"), "refers to the value that contains it"),
    (("clusters", "show", "big.yaml"), "larger than 1 MiB"),
    # documents nested 100,000 deep (RecursionError before)
    (("clusters", "show", "deep.yaml"), "nest more than 64 levels"),
    (("graph", "tiny_cnn", "--cluster", "deep-block.yaml"), "nest more than 64 levels"),
    (("run", "--config", "deep.yaml"), "nest more than 64 levels"),
    (("oracle", "deep.json"), "nest more than 64 levels"),
    (("oracle", "tiny_cnn", "--profile", "deep.json"), "profile deep.json is refused"),
    (("search", "tiny_cnn", "--devices", "2", "--cluster", "local", "--profile", "deep.json"),
     "nest more than 64 levels"),
    (("train", "tiny_cnn", "--strategy", "deep.json", "--nproc", "1"),
     "strategy file deep.json is refused"),
    ((PREPARE, "--params", "deep-params.yaml"), "nest more than 64 levels"),
    (("train", "tiny_cnn", "--resume", "runs/deep-settings"), "nest more than 64 levels"),
    ((*TRAIN, "--dataset", "deepmeta"), "meta.json is refused"),
    # files that cannot be written, found before any work
    ((*SEARCH, "--cluster", "local", "--save", "afile/s.json"), "afile is a file, not a folder"),
    ((*SEARCH, "--cluster", "local", "--save", "adir"), "--save adir: it is a directory"),
    ((*SEARCH, "--cluster", "local", "--save", "/proc/s.json"), "cannot write"),
    (("oracle", "tiny_cnn", "--save", "adir"), "--save adir: it is a directory"),
    (("profile", "tiny_cnn", "--devices", "1", "--out", "afile/p.json"), "is a file, not a"),
    (("calibrate", "--nproc", "2", "--out", "adir"), "--out adir: it is a directory"),
    ((*TRAIN, "--out", "afile/run"), "--out afile/run: afile is a file, not a folder"),
    (("verify", "tiny_cnn", "--strategy", "data", "--nproc", "1", "--out", "afile/v"),
     "afile is a file, not a folder"),
    # corrupt checkpoints, found before any worker starts
    (("train", "tiny_cnn", "--resume", "runs/ckpt-truncated", "--steps", "9"),
     "is not a torch checkpoint (empty, truncated or overwritten)"),
    (("train", "tiny_cnn", "--resume", "runs/ckpt-garbage", "--steps", "9"),
     "is not a torch checkpoint"),
    (("train", "tiny_cnn", "--resume", "runs/ckpt-empty", "--steps", "9"),
     "is not a torch checkpoint"),
    (("train", "tiny_cnn", "--resume", "runs/ckpt-pickle", "--steps", "9"),
     "holds objects other than tensors"),
    (("train", "tiny_cnn", "--resume", "runs/ckpt-list", "--steps", "9"),
     "holds a list, not a layerwise checkpoint"),
    (("train", "tiny_cnn", "--resume", "runs/ckpt-records", "--steps", "9"),
     "steps.0.step: Field required"),
    (("train", "tiny_cnn", "--resume", "runs/ckpt-othermodel", "--steps", "9"),
     "is not of this run's tiny_cnn: it lacks '"),
    (("train", "tiny_cnn", "--resume", "runs/ckpt-float64", "--steps", "9"),
     "float64, where tiny_cnn has"),
    # broken prepared datasets
    ((*TRAIN, "--dataset", "truncated"), "train.npz cannot be read (BadZipFile"),
    ((*TRAIN, "--dataset", "objects"), "holds object images and int64 labels, not numbers"),
    ((*TRAIN, "--dataset", "shapes"),
     "holds images (4, 1, 8, 8) and labels (4,), not (N, 3, 8, 8)"),
    ((*TRAIN, "--dataset", "labels"), "has labels 0..15, outside the 10 classes of meta.json"),
    # params.yaml
    ((PREPARE, "--params", "params-list.yaml"), "the top level must be a mapping"),
    ((PREPARE, "--params", "params-digits.yaml", "--seed", "-1"),
     "prepare.seed: numpy's generator takes 0 <= seed < 2^63"),
    ((PREPARE, "--params", "params-digits.yaml", "--out", "afile"),
     "cannot write in prepare.out afile: it is a file"),
    ((PREPARE, "--params", "params-huge.yaml"),
     "1,797 images at 100000x100000 would need at least 65.4 TiB of memory"),
    # a module called twice shares its weights between layers: refused by every command
    (("graph", "tests.idiom_models:SharedConv"), "module 'shared' (Conv2d) is called 2 times"),
    (("search", "tests.idiom_models:SharedConv", "--devices", "2", "--cluster", "local",
      "--analytic"),
     "shared weights are not supported"),
    (("train", "tests.idiom_models:SharedConv", "--strategy", "data", "--nproc", "1"),
     "give each call its own module"),
    (("graph", "tests.idiom_models:EvenSame"), "padding='same' with kernel (2, 2)"),
    # the batch given both ways
    ((*TRAIN, "--batch", "2", "--batch-per-device", "1"),
     "give --batch (global) or --batch-per-device, not both"),
    # auxiliary classifiers' scores while training: refused with the reason and the way out
    (("graph", "tests.idiom_models:AuxiliaryScores"),
     "returns 2 tensors packed in AuxiliaryOutputs while it trains: networks with auxiliary"),
    (("train", "tests.idiom_models:TwoScores", "--strategy", "data", "--nproc", "1",
      "--image-size", "8"), "returns 2 outputs of class scores while it trains: networks with"),
    # an op no list names is taken when it runs elementwise, refused with why it does not
    (("graph", "tests.idiom_models:ChannelSoftmax"),
     "Softmax2d (not elementwise: an output element depends on other input elements)"),
    (("graph", "tests.idiom_models:RandomSlopes"),
     "RReLU (not elementwise: it draws random numbers, which would differ per tile"),
    # cross-entropy per position needs a label per position: this failed only inside the
    # workers (without --dataset such a network takes segments); and a label per position
    # needs scores at the input's own positions
    (("train", "tests.idiom_models:ScoreMaps", "--strategy", "data", "--nproc", "1",
      "--image-size", "8", "--dataset", "synthetic"),
     "scores every position (32, 4, 8, 8), but the synthetic dataset "
                            "labels each sample once; use a dataset labelled per position"),
    (("train", "tests.idiom_models:CoarseScores", "--strategy", "data", "--nproc", "1",
      "--image-size", "8", "--dataset", "segments", "--in-channels", "3"),
     "scores positions 4x4 of an input of 8x8, while the segments dataset labels"),
    (("verify", "lenet5", "--strategy", "data", "--nproc", "2", "--dataset", "segments"),
     "the segments dataset labels every position but lenet5 outputs one score per class"),
    (("run", "--set", "models.0.name=unet3d_seg", "--set", "image_size=8"),
     "config models.0.name: unet3d_seg scores every position (64, 10, 8, 8, 8), but the "
     "digits dataset labels each sample once; use a dataset labelled per position: segments"),
    (("search", "tests.idiom_models:ChannelsLastPool", "--devices", "2", "--cluster", "local",
      "--analytic"),
     "fx node 'permute': a permute other than a pair around ops per position (x.permute("),
    # a parameter read directly by two ops is shared; a view moving values between channels
    # and rows is no channel map
    (("graph", "tests.idiom_models:SharedScale"),
     "parameter 'scale' is read by 2 ops (fx nodes mul, mul_1): shared weights"),
    (("graph", "tests.idiom_models:MixedView"),
     "(only (N, -1) flattening, or views and transposes moving whole channels"),
    # strategy files checked against the run and priced before any process starts
    ((*TRAIN_8, "--strategy", "owt_a-2.json", "--nproc", "4"),
     "strategy 'owt_a' (OWT scheme a (all-gather), fixed batch) was planned for 2 processes, "
     "not 4"),
    ((*TRAIN_8, "--strategy", "local-2.json", "--nproc", "4"), "was planned for 2 processes"),
    ((*TRAIN_8, "--strategy", "pipeline-micro-3.json", "--nproc", "2"),
     "3 micro-batches do not divide the global batch of 16"),
    ((*TRAIN_8, "--strategy", "pipeline-swapped.json", "--nproc", "2"),
     "are not consecutive blocks from device 0"),
    # control characters in a name a file gives, refused before anything prints it
    (("graph", "tiny_cnn", "--cluster", "escape.yaml"), "holds control characters"),
    ((*TRAIN, "--cluster", "escape.yaml"), "holds control characters"),
    (("train", "tiny_cnn", "--strategy", "escape.json", "--nproc", "2", "--image-size", "8",
      "--batch-per-device", "8"), "\\x1b]0;pwned\\x07data' holds control characters"),
    # a model that calls sys.exit: one line, not a silent exit 0 or its own code
    (("graph", "exiting_factory:make"), "model factory 'exiting_factory:make' called sys.exit(3)"),
    (("graph", "exiting_module:make"), "importing module 'exiting_module' of model "
                                       "'exiting_module:make' called sys.exit(0)"),
    # numbers Python will not read from text (4,300 digits), in YAML and in JSON
    (("run", "--set", f"steps={'9' * 5000}"), "more digits than layerwise reads (4,300)"),
    (("graph", "tiny_cnn", "--cluster", "huge-number.yaml"), "more digits than layerwise reads"),
    (("train", "tiny_cnn", "--strategy", "huge-number.json", "--nproc", "1"),
     "more digits than layerwise reads"),
    # a key given twice in a YAML file: YAML keeps the last one silently
    (("graph", "tiny_cnn", "--cluster", "twice.yaml"), "key 'name' is given twice (lines 5 and"),
    # a model version names folders and runs: never a path out of the project
    (("run", "--set", "models.0.version=x/../../../../tmp/escape"),
     "models.0.version: 'x/../../../../tmp/escape' is not a version label"),
    (("run", "--set", "models.0.name=../evil"), "is neither a zoo name nor package.module"),
    (("run", "--set", "models.0.name=torchvision.models:googlenet(aux_logits=False)"),
     "takes no factory arguments; write a factory in your package"),
    # --save and --out write by atomic rename: never through a link, never over a device
    ((*SEARCH, "--cluster", "local", "--save", "link.json"), "link.json: it is a symbolic link"),
    ((*SEARCH, "--cluster", "local", "--save", "/dev/null"),
     "/dev/null: it is not a regular file"),
    ((*SEARCH, "--cluster", "local", "--memory-limit", "lots"),
     "--memory-limit 'lots': cannot read 'lots' as a memory"),
    ((*SEARCH, "--cluster", "local", "--memory-limit", "-1GB"), "--memory-limit '-1GB'"),
    ((*SEARCH, "--cluster", "local", "--batch", "4", "--batch-per-device", "2"),
     "give --batch (global) or --batch-per-device, not both"),
    ((*SEARCH, "--cluster", "local", "--batch", "0"), "--batch must be at least 1 (got 0)"),
    ((*SEARCH, "--cluster", "local", "--batch-per-device", "0"),
     "--batch-per-device must be at least 1 (got 0)"),
    (("search", "tiny_cnn", "--devices", "0", "--cluster", "local", "--analytic"),
     "--devices must be at least 1 (got 0)"),
    (("profile", "tiny_cnn", "--devices", "2", "--batch", "2", "--batch-per-device", "1"),
     "give --batch (global) or --batch-per-device, not both"),
    # no plan can fit: the least any plan needs, and the layer that needs it
    ((*SEARCH, "--cluster", "local", "--memory-limit", "100kB"),
     "no plan fits 0.1 MB per device: every plan needs at least"),
    (("profile", "tiny_cnn", "--devices", "1", "--out", "link.json"), "it is a symbolic link"),
    # process counts this machine cannot run: refused before any process starts
    (("profile", "tiny_cnn", "--devices", "2", "--processes", TOO_MANY),
     f"profiling would start {int(TOO_MANY) + 1} processes on this machine's"),
    (("train", "tiny_cnn", "--strategy", "data", "--nproc", TOO_MANY),
     f"training would start {TOO_MANY} processes on this machine's"),
    (("calibrate", "--nproc", TOO_MANY, "--out", "c.yaml"),
     f"calibrating would start {TOO_MANY} processes"),
    # numbers that would need more memory than there is, refused with what they would need
    (("profile", "tiny_cnn", "--devices", "1", "--batch-per-device", "100000000"),
     "profiling tiny_cnn at a global batch of 100000000"),
    (("profile", "tiny_cnn", "--devices", "1000000"), "would need at least"),
    (("search", "alexnet", "--devices", "4096", "--cluster", "abci", "--analytic"),
     "the cost model on 4096 devices (20 per-dimension transfer tables of 13.7 GiB each)"),
    ((*TRAIN, "--batch-per-device", "100000000"),
     "training tiny_cnn at a global batch of 100000000 (100000000 per process, 1 process) "
     "would need at least"),
    ((*TRAIN, "--image-size", "100000"), "would need at least"),
    (("run", "--set", "image_size=100000"),
     "training wide_fc at a global batch of 64 on 100000x100000 images would need at least"),
]


def _files(root: Path) -> dict[str, tuple[int, int] | None]:
    """Each file's size and mtime, each folder (None): what a refused command must leave as
    it was. A run folder's empty lock file is left out: refusing to resume a folder takes its
    lock first, and the lock file stays, by design (run_folder.LOCK_FILE)."""
    return {str(path.relative_to(root)): ((path.stat().st_size, path.stat().st_mtime_ns)
                                          if path.is_file() else None)
            for path in sorted(root.rglob("*")) if path.name != LOCK_FILE}


def _invoke(argv: tuple[str, ...]) -> tuple[int, str]:
    """(exit code, what the user reads on the error stream) of one command line."""
    if argv[0] == PREPARE:
        with redirect_stdout(io.StringIO()) as printed, redirect_stderr(io.StringIO()) as said:
            code = prepare_data.main(list(argv[1:]))
        assert not printed.getvalue()  # errors go to stderr
        return code, said.getvalue()
    result = CliRunner().invoke(app, list(argv))
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        result.exception)
    return result.exit_code, result.stderr


@pytest.mark.parametrize(("argv", "fragment"), CASES,
                         ids=[" ".join(argv)[:70] for argv, _ in CASES])
def test_bad_input_is_one_line_and_exit_code_2(workspace, monkeypatch, argv, fragment):
    monkeypatch.chdir(workspace)
    monkeypatch.syspath_prepend(str(workspace))  # its model modules, as PYTHONPATH gives them
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # no __pycache__ in the workspace
    for name, value in embedded_environment(workspace).items():  # what `run` would set
        monkeypatch.setenv(name, os.environ.get(name, value))
    before = _files(workspace)
    code, output = _invoke(argv)
    lines = [line for line in output.splitlines() if line.strip()]
    assert code == 2, output
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    assert fragment in lines[0], lines[0]
    assert _files(workspace) == before  # nothing half-written, nothing stray
    assert len(lines[0]) < 400


def _truncated_store() -> bytes:
    """The first pages of a SQLite file whose schema runs past them (as a copy cut short)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder, "store.db")
        with contextlib.closing(sqlite3.connect(path)) as database:
            for table in range(200):
                database.execute(f"CREATE TABLE t{table} (a INTEGER, b TEXT, c REAL)")
            database.commit()
        return path.read_bytes()[: 2 * 4096]


_TRUNCATED_STORE = _truncated_store()


# (variable, value, command line, fragment, exit code): a store or service the environment
# names that MLflow or Prefect cannot use; {workspace} stands for the workspace's path
ENVIRONMENT_CASES = [
    ("MLFLOW_TRACKING_URI", "sqlite:///{workspace}/garbage.db", ("compare",),
     "is not a SQLite database, or a damaged one", 1),
    ("MLFLOW_TRACKING_URI", "sqlite:///{workspace}/truncated.db", ("compare",),
     "is not a SQLite database, or a damaged one", 1),
    ("MLFLOW_TRACKING_URI", "bogus://x", ("compare",), "names no store MLflow can open", 2),
    ("MLFLOW_TRACKING_URI", "bogus://x", ("run", "--set", "steps=1"),
     "names no store MLflow can open", 2),
    ("PREFECT_API_URL", "http://[::1", ("run", "--set", "steps=1"),
     "PREFECT_API_URL=http://[::1 is not an http(s) URL", 2),
    ("PREFECT_API_URL", "http://[::1", ("serve", "--cron", "0 2 * * *"),
     "is not an http(s) URL", 2),
]


@pytest.mark.parametrize(("variable", "value", "argv", "fragment", "code"), ENVIRONMENT_CASES,
                         ids=[f"{case[0]}={case[1]} {case[2][0]}" for case in ENVIRONMENT_CASES])
def test_a_broken_store_or_service_is_one_line_naming_it(workspace, monkeypatch, variable,
                                                         value, argv, fragment, code):
    monkeypatch.chdir(workspace)
    (workspace / "garbage.db").write_bytes(b"not a database\n" * 64)
    (workspace / "truncated.db").write_bytes(_TRUNCATED_STORE)
    for name, default in embedded_environment(workspace).items():
        monkeypatch.setenv(name, os.environ.get(name, default))
    monkeypatch.setenv(variable, value.format(workspace=workspace))
    before = _files(workspace)
    exit_code, output = _invoke(argv)
    lines = [line for line in output.splitlines() if line.strip()]
    assert exit_code == code and len(lines) == 1 and fragment in lines[0], output
    assert _files(workspace) == before


def test_the_bomb_is_a_real_one():
    """PyYAML's own safe loader takes the bomb as 9^9 values, as a user's process did."""
    document = yaml.safe_load(BOMB)
    assert len(document["i"]) == 9 and document["i"][0][0][0][0][0][0][0][0][0] == "lol"


def test_what_the_bounds_leave_alone_still_reads(tmp_path):
    """Anchors used as meant (one link written once), and JSON nested as deep as allowed."""
    from layerwise.strategies.files.documents import MAX_DEPTH, read_json

    preset = (PRESETS / "abci.yaml").read_text()
    shared = preset.replace("  intra_node:\n    bandwidth: 50 GB/s\n    latency: 9 us\n",
                            "  intra_node: &fast\n    bandwidth: 50 GB/s\n    latency: 9 us\n")
    shared = shared.replace(
        "  link:\n    bandwidth: 12.5 GB/s\n    latency: 30.71 us\n    shared_by: 2",
        "  link: {<<: *fast, bandwidth: 12.5 GB/s, latency: 30.71 us, shared_by: 2}")
    assert "*fast" in shared
    (tmp_path / "shared.yaml").write_text(shared)
    assert load_cluster(tmp_path / "shared.yaml") == load_cluster("abci")
    (tmp_path / "deep.json").write_text(_nested(MAX_DEPTH))
    expected: list = []
    for _ in range(MAX_DEPTH - 1):
        expected = [expected]
    assert read_json(tmp_path / "deep.json", "deep.json") == expected


def test_date_shaped_yaml_values_stay_text():
    """PyYAML reads 2001-13-45 as a date and fails inside the loader; no field is a date."""
    from layerwise.strategies.files.documents import parse_yaml

    assert parse_yaml("name: 2001-13-45\nday: 2001-01-01\n", "config c.yaml") == {
        "name": "2001-13-45", "day": "2001-01-01"}
