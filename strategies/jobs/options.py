"""The options of a training run: the typed contract between `layerwise train`, the benchmark
flow and the torchrun job.

Range errors are one-line LayerwiseErrors that name the command-line option, so that a user
sees the same line whichever way the run was asked for.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.hardware.endpoint import Endpoint, parse_endpoint
from layerwise.strategies.hyperparameters import (
    ClassCount,
    LearningRate,
    Momentum,
    WarmupSteps,
    WeightDecay,
    global_batch,
)
from layerwise.strategies.jobs.defaults import DEFAULT_BATCH_PER_DEVICE, MAX_WAIT_SECONDS
from layerwise.strategies.learning_rate import (
    DEFAULT_LR,
    DEFAULT_LR_DECAY,
    DEFAULT_WARMUP_STEPS,
    LrDecay,
)
from layerwise.strategies.model.input_size import InputSize

# The order in which out-of-range options are reported (the first one found is named).
_RANGE_CHECK_ORDER = ("nproc", "nnodes", "batch", "batch_per_device", "classes", "lr", "seed",
                      "momentum", "weight_decay", "warmup_steps")


class TrainOptions(BaseModel):
    """What defines a training run besides its model and strategy.

    The fields a caller set are `model_fields_set`: a resumed run checks exactly those against
    the run it continues. None for image_size, classes and in_channels means the prepared
    dataset's, else the model's; nproc must be given for a new run. The global batch is
    `batch` when given (it may be smaller than the processes: spatial and channel splits then
    share a sample), else `batch_per_device` (default DEFAULT_BATCH_PER_DEVICE) on each.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    nproc: int | None = Field(default=None, gt=0)  # processes per node
    nnodes: int = Field(default=1, gt=0)
    cluster: str = "local"  # preset or YAML for the prediction
    profile: str | None = None  # profile JSON for the predicted t_c; None: analytic
    dataset: str = "synthetic"
    batch_per_device: int | None = Field(default=None, gt=0)
    batch: int | None = Field(default=None, gt=0)  # global
    image_size: InputSize | None = None  # a side for every spatial dim, or each dim's size
    classes: ClassCount | None = None
    in_channels: int | None = None
    lr: LearningRate = DEFAULT_LR
    momentum: Momentum = 0.9
    weight_decay: WeightDecay = 1e-4
    seed: int = Field(default=0, ge=0, lt=2**63)  # torch's generators take 64-bit seeds
    warmup_steps: WarmupSteps = DEFAULT_WARMUP_STEPS
    lr_decay: LrDecay = DEFAULT_LR_DECAY

    @classmethod
    def given(cls, **values: Any) -> TrainOptions:
        """The options a user gave (None: not given, its default applies); LayerwiseError
        naming the first one out of range, or the batch given both ways."""
        if values.get("batch") is not None and values.get("batch_per_device") is not None:
            raise LayerwiseError("give --batch (global) or --batch-per-device, not both")
        try:
            return cls(**{name: value for name, value in values.items() if value is not None})
        except ValidationError as error:
            raise LayerwiseError(_range_error(error)) from None

    @property
    def per_device(self) -> int | None:
        """Samples per process, the default when neither way was given; None with `batch`."""
        if self.batch is not None:
            return None
        return self.batch_per_device or DEFAULT_BATCH_PER_DEVICE

    def global_batch(self, world: int) -> int:
        """The samples of one step over all `world` processes."""
        return global_batch(self.batch, self.per_device, world)

    def batch_phrase(self, world: int) -> str:
        """How the global batch was asked for, for messages."""
        processes = f"{world} process{'es' * (world > 1)}"
        if self.per_device is None:
            return f"a global batch of {self.batch} over {processes}"
        return (f"a global batch of {self.global_batch(world)} ({self.per_device} per process, "
                f"{processes})")

    def given_values(self) -> dict[str, Any]:
        """The options that were set, by name, in field order."""
        return {name: getattr(self, name) for name in type(self).model_fields
                if name in self.model_fields_set}


def check_launch_numbers(steps: int | None, epochs: int | None, checkpoint_every: int,
                         timeout: float) -> None:
    """LayerwiseError for a run length, checkpoint interval or collective timeout out of range."""
    if steps is not None and epochs is not None:
        raise LayerwiseError("give --steps or --epochs, not both")
    for name, value in {"steps": steps, "epochs": epochs, "checkpoint_every": checkpoint_every,
                        "timeout": timeout}.items():
        if value is not None and not (0 < value < math.inf):  # nan and inf too
            raise LayerwiseError(f"{_flag(name)} must be a finite number > 0 (got {value})")
    if timeout > MAX_WAIT_SECONDS:
        raise LayerwiseError(f"--timeout must be at most {MAX_WAIT_SECONDS:.0f} s (a week; got "
                             f"{timeout:g})")


def check_nodes(nnodes: int, node_rank: int | None,
                rdzv_endpoint: str | None) -> Endpoint | None:
    """Node 0's address, parsed once for the launch; LayerwiseError unless a run on several
    machines names this machine's place and node 0's address (HOST:PORT, the host
    resolving), and a run on one names neither (None then)."""
    if nnodes > 1:
        if node_rank is None or rdzv_endpoint is None:
            raise LayerwiseError("several nodes need --node-rank (this machine's index) and "
                                 "--rdzv-endpoint HOST:PORT (node 0's address)")
        if not 0 <= node_rank < nnodes:
            raise LayerwiseError(f"--node-rank must be 0..{nnodes - 1} for --nnodes {nnodes} "
                                 f"(got {node_rank})")
        return parse_endpoint(rdzv_endpoint)
    if node_rank is not None or rdzv_endpoint is not None:
        raise LayerwiseError("--node-rank and --rdzv-endpoint are for --nnodes > 1")
    return None


def _range_error(error: ValidationError) -> str:
    """One line for the first option out of range, as the command line names it."""
    problems = {str(problem["loc"][0]): problem for problem in error.errors()}
    ranked = sorted(problems, key=lambda name: (_RANGE_CHECK_ORDER.index(name)
                                                if name in _RANGE_CHECK_ORDER
                                                else len(_RANGE_CHECK_ORDER)))
    name = ranked[0]
    problem = problems[name]
    bound = problem.get("ctx", {})
    if problem["type"] == "finite_number":
        return f"{_flag(name)} must be a finite number (got {problem['input']})"
    for key, relation in (("gt", ">"), ("ge", ">="), ("lt", "<")):
        if key in bound:
            return f"{_flag(name)} must be {relation} {bound[key]:g} (got {problem['input']})"
    return f"{_flag(name)}: {problem['msg']} (got {problem['input']!r})"


def _flag(name: str) -> str:
    return f"--{name.replace('_', '-')}"
