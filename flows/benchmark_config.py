"""The BenchmarkConfig contract: what one run of the benchmark flow measures.

    layerwise run                                   # configs/benchmark.yaml (or defaults)
    layerwise run --config my.yaml --set steps=80 --set strategies=[data,owt]
    layerwise run --set models.0.name=lenet5 --set models.0.version=v2

A YAML file (by default the project's configs/benchmark.yaml, else the embedded defaults, which
equal it) with `--set key=value` overrides on
top: dotted keys reach into mappings and lists (`models.0.name`), values are YAML scalars or
flow sequences. Anything wrong, in the file or an override, is one line naming the field.
This module imports pydantic, yaml and the registry's names only, so a bad config fails before
Prefect starts.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from layerwise.strategies.errors import LayerwiseError, shown
from layerwise.strategies.files.atomic import first_error
from layerwise.strategies.files.documents import parse_yaml, read_yaml
from layerwise.strategies.hardware.cluster import MemoryBytes
from layerwise.strategies.hyperparameters import (
    LearningRate,
    Momentum,
    WarmupSteps,
    WeightDecay,
    global_batch,
)
from layerwise.strategies.jobs.defaults import DEFAULT_VERIFY_STEPS, MAX_WAIT_SECONDS
from layerwise.strategies.learning_rate import DEFAULT_LR_DECAY, DEFAULT_WARMUP_STEPS, LrDecay
from layerwise.strategies.schedules import STRATEGY_NAMES
from layerwise.strategies.text import printable

SCHEMA_VERSION = 1
MODEL_REFERENCE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*(:[A-Za-z_][A-Za-z0-9_.]*)?")
VERSION_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# `cluster: calibrated`: the flow measures this machine's links between its nproc ranks first
CALIBRATED = "calibrated"
# the project's benchmark, relative to the folder `layerwise run` runs in (a checkout's root, or
# a folder `layerwise init` wrote); where there is none, the embedded defaults, equal to it
PROJECT_CONFIG = Path("configs") / "benchmark.yaml"
StrategyName = Literal[STRATEGY_NAMES]  # every name the registry holds


class ModelVersion(BaseModel):
    """A model to benchmark and the label its runs are compared under (the structure hash,
    computed from the traced graph, tells whether two labels really differ). Both name the
    run folders, MLflow runs and registry aliases, so they are names, never paths: a zoo name
    or `package.module:factory`, and a label of letters, digits, '.', '_' and '-'."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    version: str = Field(default="v1", min_length=1, max_length=64)

    @field_validator("name")
    @classmethod
    def _model_reference(cls, value: str) -> str:
        if "(" in value and MODEL_REFERENCE.fullmatch(value.partition("(")[0].strip()):
            raise ValueError(f"'{printable(value)}': a benchmark's model names its folders and "
                             "MLflow runs, so it takes no factory arguments; write a factory "
                             "in your package that passes them and name that")
        if not MODEL_REFERENCE.fullmatch(value):
            raise ValueError(f"'{printable(value)}' is neither a zoo name nor "
                             "package.module:factory")
        return value

    @field_validator("version")
    @classmethod
    def _label(cls, value: str) -> str:
        if not VERSION_LABEL.fullmatch(value):
            raise ValueError(f"'{printable(value)}' is not a version label: use letters, "
                             "digits, '.', '_' and '-' (it names folders and runs)")
        return value


Side = Annotated[int, Field(ge=1, strict=True)]  # `image_size: true` is not 1 pixel


class BenchmarkConfig(BaseModel):
    """Models, processes, strategies, data and training settings of one benchmark run.

    Every field defaults to the embedded benchmark (configs/benchmark.yaml shows the same
    values, tests/test_benchmark_flow.py keeps them equal), so a partial config, a file or a
    deployment's `--param config='{"steps": 60}'`, changes only what it names. Giving `batch`
    alone drops the default `batch_per_device`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = SCHEMA_VERSION
    name: str = Field(default="layerwise-benchmark", min_length=1)  # the MLflow experiment
    models: tuple[ModelVersion, ...] = Field(
        default=(ModelVersion(name="wide_fc", version="v1"),), min_length=1)
    nproc: int = Field(default=2, ge=1, strict=True)
    strategies: tuple[StrategyName, ...] = Field(default=("layerwise", "data", "owt"),
                                                 min_length=1)
    dataset: Literal["digits", "synthetic", "segments", "cifar10", "imagefolder", "fields",
                     "fields3d", "signals"] = "digits"
    # a side for every spatial dim of the models (a square image, a cube volume), or a list of
    # each dim's size: [L] of a signal, [D, H, W] of a volume
    image_size: Side | tuple[Side, ...] = 32
    classes: int = Field(default=10, ge=2, strict=True)
    # the global batch: `batch`, else batch_per_device on each of the nproc processes
    batch_per_device: int | None = Field(default=32, ge=1, strict=True)
    batch: int | None = Field(default=None, ge=1, strict=True)
    steps: int = Field(default=150, ge=1, strict=True)  # `steps: true` is not 1 step
    lr: LearningRate = 0.05  # the peak, after the warm-up
    momentum: Momentum = 0.9
    weight_decay: WeightDecay = 1e-4
    seed: int = Field(default=0, ge=0, lt=2**63, strict=True)
    warmup_steps: WarmupSteps = DEFAULT_WARMUP_STEPS
    lr_decay: LrDecay = DEFAULT_LR_DECAY
    cluster: str = CALIBRATED  # or a preset or a cluster YAML (tasks/calibrate.py)
    # share of the validation split an fp32 run may differ from one process by; None: a
    # binomial bound in images (strategies/exactness/accuracy.py); exactness is verified in float64
    tolerance: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    inexact_tolerance: float = Field(default=0.1, ge=0, allow_inf_nan=False)  # not exact ones
    profile: bool = True
    # bytes each device may hold ("8MB"): the searched plan is held to it, every strategy's
    # predicted and measured peak judged against it; None: the cluster device's memory
    memory_limit: MemoryBytes | None = None
    # float64 steps per strategy in the verify stage (exactness against one process); 0 skips it
    verify_steps: int = Field(default=DEFAULT_VERIFY_STEPS, ge=0, strict=True)
    train_deadline_s: float = Field(default=600.0, gt=0, le=MAX_WAIT_SECONDS,
                                    allow_inf_nan=False)
    # each run's trained model becomes a version of the model's name in MLflow's registry,
    # tagged with its version label, strategy and cluster and aliased `<version>-<strategy>`;
    # each (version, cluster)'s fastest passing strategy holds `champion-<version>-<cluster>`
    register_model: bool = True
    # the share of the champion's measured step a strategy must save, measured in the same run,
    # to take the champion alias; the champion's strategy measured more than this share slower
    # than its recorded step is a regression (tasks/tracking/champion.py)
    champion_margin: float = Field(default=0.05, ge=0, lt=1, allow_inf_nan=False, strict=True)
    # the prepared dataset pushed to the project's DVC remote after `dvc repro`, so another
    # clone's `dvc pull` finds it
    dvc_push: bool = True
    # the flow run fails when a model version's searched plan measures slower than data
    # parallelism beyond the measurement's spread, or its champion's strategy slower than the
    # champion's recorded step beyond champion_margin (a nightly's regression guard)
    fail_on_regression: bool = True

    @model_validator(mode="before")
    @classmethod
    def _batch_replaces_the_default(cls, data: Any) -> Any:
        """A config naming `batch` and not `batch_per_device` means the global batch alone."""
        if (isinstance(data, dict) and data.get("batch") is not None
                and "batch_per_device" not in data):
            return {**data, "batch_per_device": None}
        return data

    @property
    def global_batch(self) -> int:
        return global_batch(self.batch, self.batch_per_device, self.nproc)

    @model_validator(mode="after")
    def _one_batch(self) -> BenchmarkConfig:
        if (self.batch is None) == (self.batch_per_device is None):
            raise ValueError("set batch (global) or batch_per_device, one of them")
        return self

    @model_validator(mode="after")
    def _links_to_measure(self) -> BenchmarkConfig:
        if self.cluster == CALIBRATED and self.nproc < 2:
            raise ValueError(f"cluster: {CALIBRATED} measures the links between nproc >= 2 "
                             f"processes (nproc is {self.nproc}); set cluster: local")
        return self

    @field_validator("strategies")
    @classmethod
    def _distinct(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(names)) != len(names):
            raise ValueError(f"lists a strategy twice: {list(names)}")
        return names

    @field_validator("models")
    @classmethod
    def _distinct_versions(cls, models: tuple[ModelVersion, ...]) -> tuple[ModelVersion, ...]:
        labels = [(model.name, model.version) for model in models]
        if len(set(labels)) != len(labels):
            raise ValueError("lists a model version twice")
        return models


def load_config(path: Path | None = None, overrides: list[str] | tuple[str, ...] = ()
                ) -> BenchmarkConfig:
    """The config in `path` (default: the project's configs/benchmark.yaml, else the
    embedded defaults) with `key=value` overrides applied."""
    source = path or (PROJECT_CONFIG if PROJECT_CONFIG.is_file() else None)
    # the embedded defaults as a document, so that overrides reach into them (`models.0.name`)
    document = (_read_yaml(source) if source is not None
                else BenchmarkConfig().model_dump(mode="json"))
    for override in overrides:
        _apply_override(document, override)
    try:
        return BenchmarkConfig.model_validate(document)
    except ValidationError as problem:
        raise LayerwiseError(f"config {source or 'defaults'}: {first_error(problem)}") from None


def _read_yaml(path: Path) -> dict[str, Any]:
    document = read_yaml(path, f"config {path}")
    if not isinstance(document, dict):
        raise LayerwiseError(f"config {path}: top level: expected a mapping of fields")
    return document


# the two ways of giving the batch: setting one drops the other the file gave
_BATCH_ALTERNATIVES = {"batch": "batch_per_device", "batch_per_device": "batch"}


def _apply_override(document: dict[str, Any], override: str) -> None:
    """Set `a.b.0.c=value` in place; the value is parsed as YAML (`[data, owt]`, `1e-3`).
    `--set batch=4` replaces the file's batch_per_device (and the other way round)."""
    key, separator, text = override.partition("=")
    if not separator or not key.strip():
        raise LayerwiseError(f"--set {shown(override)}: write key=value, e.g. --set steps=80")
    value = parse_yaml(text, f"--set {shown(override)}: the value")
    if key.strip() in _BATCH_ALTERNATIVES:
        document.pop(_BATCH_ALTERNATIVES[key.strip()], None)
    parts = key.strip().split(".")
    container: Any = document
    for depth, part in enumerate(parts[:-1]):
        container = _child(container, part, ".".join(parts[:depth + 1]))
    _assign(container, parts[-1], value, key.strip())


def _index(container: list[Any], part: str) -> int | None:
    """`part` as an index into `container`: ASCII digits only ('²' passes str.isdigit) and no
    longer than the list's length could need (a 5,000-digit index cannot be read)."""
    if part.isascii() and part.isdigit() and len(part) <= len(str(len(container))):
        index = int(part)
        return index if index < len(container) else None
    return None


def _child(container: Any, part: str, where: str) -> Any:
    if isinstance(container, dict):
        return container.setdefault(part, {})
    if isinstance(container, list) and (index := _index(container, part)) is not None:
        return container[index]
    raise LayerwiseError(f"--set: {shown(where)}: no such field to set")


def _assign(container: Any, part: str, value: Any, where: str) -> None:
    if isinstance(container, dict):
        container[part] = value
    elif isinstance(container, list) and (index := _index(container, part)) is not None:
        container[index] = value
    else:
        raise LayerwiseError(f"--set: {shown(where)}: no such field to set")
