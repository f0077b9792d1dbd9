"""The contracts of one training run: what it is (`TrainSettings`) and what it did (`RunResult`).

`layerwise train` writes both into the run folder: train.json before any process starts (the
workers read it; `--resume` reuses it so the continued run trains exactly the same problem) and
the workers' rank 0 writes result.json at the end. The pipeline and users' scripts read
result.json: per-step loss and time, measured bytes next to the cost model's prediction, memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator

from layerwise.strategies.files.atomic import read_json_model, write_atomic
from layerwise.strategies.hyperparameters import (
    ClassCount,
    LearningRate,
    Momentum,
    WarmupSteps,
    WeightDecay,
    global_batch,
)
from layerwise.strategies.learning_rate import (
    DEFAULT_LR_DECAY,
    DEFAULT_WARMUP_STEPS,
    LrDecay,
    learning_rate,
)
from layerwise.strategies.model.input_size import InputSize
from layerwise.strategies.strategy import Strategy

SCHEMA_VERSION = 2  # 2: the learning-rate schedule; a diverged loss (NaN, inf) is kept


class TrainSettings(BaseModel):
    """Everything that defines a run's training problem; equal settings give equal runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = SCHEMA_VERSION
    model: str
    strategy: str  # as the user named it: a strategy name or a file path
    nproc: int  # processes per node
    nnodes: int
    cluster: str
    profile: str | None  # None: analytic t_c
    dataset: str
    data_root: str
    # the global batch: `batch`, else batch_per_device on every process (exactly one is set)
    batch_per_device: int | None = None
    batch: int | None = None
    image_size: InputSize  # the square image's side, or each spatial dim's size
    classes: ClassCount
    in_channels: int
    lr: LearningRate  # the peak of the schedule
    momentum: Momentum
    weight_decay: WeightDecay
    seed: int
    warmup_steps: WarmupSteps = DEFAULT_WARMUP_STEPS
    lr_decay: LrDecay = DEFAULT_LR_DECAY
    # float64 makes rounding too small to flip a ReLU or a max-pool tie, so a strategy's
    # weights must equal one device's to ~1e-13: what `layerwise verify` trains in
    dtype: Literal["float32", "float64"] = "float32"

    @property
    def world(self) -> int:
        return self.nproc * self.nnodes

    @model_validator(mode="after")
    def _one_batch(self) -> TrainSettings:
        self.global_batch  # noqa: B018 - raises unless exactly one of the two is set
        return self

    @property
    def global_batch(self) -> int:
        return global_batch(self.batch, self.batch_per_device, self.world)

    def lr_at(self, step: int) -> float:
        """SGD's learning rate at step `step` (1-based), the same on every rank and engine."""
        return learning_rate(self.lr, self.warmup_steps, self.lr_decay, step)

    def save(self, path: str | Path) -> Path:
        return write_atomic(path, self.model_dump_json(indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> TrainSettings:
        return read_json_model(cls, path, "run settings",
                               "it is written by `layerwise train`; start a new run")


class StepRecord(BaseModel):
    # a diverged loss is NaN or inf: written as JSON's NaN/Infinity (which json and pydantic
    # read back), not as null, which no float field takes
    model_config = ConfigDict(frozen=True, ser_json_inf_nan="constants")

    step: int  # 1-based
    loss: float  # mean cross-entropy over the global batch
    seconds: float  # forward, backward and optimizer step
    # the step ran with its peak memory measured (on the CPU under torch's profiler, which
    # slows it): left out of the step-time statistics when others remain
    memory_measured: bool = False


class ByteCounts(BaseModel):
    """Bytes sent per training step, summed over all ranks."""

    model_config = ConfigDict(frozen=True)

    transfer: int
    sync: int


class WaitSeconds(BaseModel):
    """Seconds per training step a rank was blocked in communication, by what it waited for:
    the median over the timed steps of the rank that waited least in each (a rank idle while
    another computes a layer alone waits for that compute, which is t_c; the least-waiting
    rank's waits are the communication itself). Beside Eq. 1's t_x and t_s, whose `loss`
    part the output layer's t_s prices."""

    model_config = ConfigDict(frozen=True)

    transfer: float
    sync: float
    loss: float


class RunResult(BaseModel):
    """What one `layerwise train` run measured, next to what the cost model predicted."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")

    schema_version: int = SCHEMA_VERSION
    model: str
    strategy: Strategy  # its name, per-layer configs and the prediction for this run
    nproc: int  # all processes, over all nodes
    steps: tuple[StepRecord, ...]
    warmup_steps: int  # the first steps, left out of the step-time statistics
    step_seconds_median: float  # over the steps after the warm-up
    step_seconds_quartiles: tuple[float, float]  # 25th and 75th percentile of the same steps
    throughput_samples_per_s: float
    bytes_per_step: ByteCounts
    predicted_bytes_per_step: ByteCounts
    predicted_step_seconds: float
    # the most bytes of tensors each rank held during one measured step (its second, or its
    # only; strategies/runtime/memory_peak.py); empty when no step was measured (verify)
    peak_memory_bytes_per_rank: tuple[int, ...]
    # beyond the contract of issue 4
    loss_bytes_per_step: int  # the cross-entropy's all-reduces, which Eq. 1 does not count
    bytes_per_step_by_layer: dict[str, dict[str, int]]  # layer -> category -> bytes
    # measured waits in communication; None where the engine's waits are not clocked (OWT's
    # hand-offs, the pipeline's and local parallelism's own engines) or no step was timed
    wait_seconds_per_step: WaitSeconds | None = None
    global_batch: int
    nnodes: int
    resumed_from_step: int  # 0 when the run started from scratch
    # the step at which the loss diverged and the run stopped (its last); None: it did not
    diverged_at_step: int | None = None
    settings: TrainSettings
    backend: str
    device: str
    torch_version: str
    # whether the workers put large CPU tensors on huge pages (strategies/processes/huge_pages.py),
    # which moves a large model's CPU step times (AlexNet 1.4x); False in older results
    huge_pages: bool = False
    host: str
    finished: str  # ISO 8601, UTC

    def save(self, path: str | Path) -> Path:
        return write_atomic(path, self.model_dump_json(indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> RunResult:
        return read_json_model(cls, path, "run result",
                               "it is written by `layerwise train` when a run finishes")
