"""A training job checked before any process starts: its settings, strategy, layer graph,
batches and run folder.

Everything that can be wrong is found here (one-line LayerwiseError): the strategy against the
model's layer graph at the global batch (batch per device x processes), the dataset against the
model's input, the run folder, a resumed run's options against the run it continues. The run
folder is claimed first (strategies/jobs/run_folder.py), so that no other launch can take it
between the check and the run; a job is a context manager that lets it go, and a job refused
on its way leaves no folder behind.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import torch

from layerwise.strategies.errors import ConfigError, LayerwiseError
from layerwise.strategies.files.atomic import creatable_folder
from layerwise.strategies.files.locations import (
    CHECKPOINT_FILE,
    PREPARED_DIR,
    SETTINGS_FILE,
    STRATEGY_FILE,
)
from layerwise.strategies.hardware.cluster import load_cluster
from layerwise.strategies.hardware.endpoint import Endpoint
from layerwise.strategies.hardware.host_memory import (
    check_memory,
    check_processes,
    training_bytes,
)
from layerwise.strategies.jobs.named_strategies import strategy_by_name
from layerwise.strategies.jobs.options import TrainOptions, check_nodes
from layerwise.strategies.jobs.pricing import cost_model
from layerwise.strategies.jobs.run_folder import (
    FolderClaim,
    claim_existing_run,
    claim_new_folder,
    claim_stamped_folder,
)
from layerwise.strategies.model.graph import SEVERAL_OUTPUTS, LayerGraph, build_graph
from layerwise.strategies.model.input_size import InputSize, compact_size, spatial_size
from layerwise.strategies.model.zoo import build_model
from layerwise.strategies.runtime.checkpoint import resume_point
from layerwise.strategies.runtime.datasets import (
    GlobalBatches,
    labels_positions,
    load_dataset,
    prepared_spec,
)
from layerwise.strategies.runtime.plan import build_plan
from layerwise.strategies.schedules import STRATEGY_NAMES
from layerwise.strategies.schedules.loader import repriced
from layerwise.strategies.strategy import Strategy
from layerwise.strategies.training_run import TrainSettings

RUNS_DIR = Path("runs")  # where run folders go unless one is named; relative to the project


@dataclass(frozen=True)
class Job:
    """A checked run, ready to launch: what it trains, where it writes, where it starts, and
    this machine's place among the run's nodes. `with job:` holds its folder until the end."""

    settings: TrainSettings
    strategy: Strategy
    graph: LayerGraph
    batches: GlobalBatches
    claim: FolderClaim
    checkpoint_step: int | None  # the step to resume after; None starts at step 1
    node_rank: int = 0
    rdzv_endpoint: Endpoint | None = None  # node 0's HOST:PORT, for a run on several nodes
    checkpoint: Path | None = None  # the file it resumes from
    # what the launcher says before it starts (idle ranks, layers an op holds to fewer dims)
    warnings: tuple[str, ...] = ()

    @property
    def out(self) -> Path:
        return self.claim.path

    def __enter__(self) -> Job:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.claim.release()


def new_job(model: str, strategy: str | None, options: TrainOptions, out: Path | None,
            analytic: bool, node_rank: int | None = None,
            rdzv_endpoint: str | None = None, graph: LayerGraph | None = None) -> Job:
    """A run from the options given (defaults for the rest), checked before anything is
    written, in a folder claimed first (`out`, else a new one under runs/). A caller that
    built the model's layer graph for these options already (the benchmark flow) passes it as
    `graph`: it is checked to be that graph, and not built again."""
    if strategy is None:
        raise LayerwiseError("pass --strategy layerwise|data|model|owt|FILE (or --resume DIR)")
    if options.nproc is None:
        raise LayerwiseError("pass --nproc N, the number of processes per node")
    endpoint = check_nodes(options.nnodes, node_rank, rdzv_endpoint)
    check_processes(options.nproc, "training", "--nproc")
    if options.nnodes > 1 and out is None:
        raise LayerwiseError("several nodes share one run folder: pass --out DIR on a "
                             "filesystem every node sees")
    world = options.nproc * options.nnodes
    with claim_folder(out, model, strategy, node_rank or 0).released_on_error() as claim:
        return _new_job(model, strategy, options, world, claim, analytic, node_rank or 0,
                        endpoint, graph)


def _graph_arguments(options: TrainOptions) -> dict[str, int | None]:
    """The input size, classes and channels a run's graph is built at: the options given, else
    the prepared dataset's, else the model's own."""
    fixed = prepared_spec(options.dataset, PREPARED_DIR)
    return {"image_size": _given_or(options.image_size, fixed.image_size if fixed else None),
            "num_classes": _given_or(options.classes, fixed.classes if fixed else None),
            "in_channels": _given_or(options.in_channels, fixed.channels if fixed else None)}


def job_graph(model: str, options: TrainOptions) -> LayerGraph:
    """The layer graph a new job of `model` with `options` trains (tracing a model takes
    seconds: a caller running several jobs of one model builds it once and passes it)."""
    world = (options.nproc or 1) * options.nnodes
    return build_graph(model, batch=options.global_batch(world), **_graph_arguments(options))


def _new_job(model: str, strategy: str, options: TrainOptions, world: int, claim: FolderClaim,
             analytic: bool, node_rank: int, rdzv_endpoint: Endpoint | None,
             built: LayerGraph | None) -> Job:
    arguments = _graph_arguments(options)
    batch = options.global_batch(world)
    graph = built if built is not None else build_graph(model, batch=batch, **arguments)
    _check_graph_fits(graph, model, batch, arguments["image_size"], arguments["in_channels"])
    check_memory(training_bytes(graph, options.nnodes),
                 f"training {model} at {options.batch_phrase(world)}",
                 "use a smaller --batch or --image-size, or more machines")
    chosen_data: tuple[str, ...] = ()
    if "dataset" not in options.model_fields_set and scores_every_position(graph):
        # the default data labels each sample once; this network needs a label per position
        options = options.model_copy(update={"dataset": "segments"})
        chosen_data = (f"dataset: segments (generated, a label per position), as {model} "
                       "scores every position; --dataset chooses another",)
    check_class_scores(graph, model, options.dataset)
    classes = graph.by_name[graph.outputs[0]].output_shape[1]
    if classes < 2:  # --classes is checked; a model of one's own may still output one score
        raise LayerwiseError(f"{model} outputs {classes} class score(s): cross-entropy over "
                             "fewer than 2 classes is 0 whatever the weights; train a model "
                             "with 2 or more outputs (--classes N)")
    chosen = _resolve_strategy(strategy, graph, world, options, analytic)
    settings = TrainSettings(
        model=model, strategy=strategy, data_root=str(PREPARED_DIR.resolve()),
        image_size=compact_size(graph.input_shape[2:]), in_channels=graph.input_shape[1],
        classes=classes,
        batch_per_device=options.per_device,
        **options.model_dump(exclude={"image_size", "classes", "in_channels",
                                      "batch_per_device"}))
    return Job(settings=settings, strategy=chosen, graph=graph, batches=_batches(settings),
               claim=claim, checkpoint_step=None, node_rank=node_rank,
               rdzv_endpoint=rdzv_endpoint,
               warnings=(*chosen_data, *_idle_warning(chosen, world),
                         *(f"held: {note}" for note in graph.held_notes)))


def _check_graph_fits(graph: LayerGraph, model: str, batch: int, image_size: InputSize | None,
                      in_channels: int | None) -> None:
    """A graph handed in must be the one these options build (a caller's mistake, not a
    user's)."""
    sizes = graph.input_shape[2:]
    if graph.model != model or graph.batch != batch or (
            image_size is not None and spatial_size(image_size, len(sizes)) != sizes) or (
            in_channels is not None and graph.input_shape[1] != in_channels):
        raise ValueError(f"the graph of {graph.model} at batch {graph.batch}, input "
                         f"{graph.input_shape}, is not {model}'s at batch {batch}")


def scores_every_position(graph: LayerGraph) -> bool:
    """Whether the network's one output scores every position, (batch, classes, *positions)."""
    return len(graph.outputs) == 1 and len(graph.by_name[graph.outputs[0]].output_shape) > 2


def check_class_scores(graph: LayerGraph, model: str, dataset: str) -> None:
    """Training takes cross-entropy of one tensor of class scores: (batch, classes) against a
    label per sample, or (batch, classes, *positions) against a dataset's label per position
    of the input. Anything else would fail only inside the workers, after the run folder is
    written."""
    shapes = [graph.by_name[name].output_shape for name in graph.outputs]
    if len(shapes) > 1 and all(len(shape) == 2 and shape[0] == graph.batch
                               for shape in shapes):
        raise LayerwiseError(f"{model} returns {len(shapes)} outputs of class scores while it "
                             f"trains: {SEVERAL_OUTPUTS}")
    if len(shapes) != 1 or len(shapes[0]) < 2 or shapes[0][0] != graph.batch:
        shown_shapes = ", ".join(str(tuple(shape)) for shape in shapes)
        raise LayerwiseError(f"{model} returns {shown_shapes} at a batch of {graph.batch}: "
                             "training needs one (batch, classes) tensor of class scores (or "
                             "(batch, classes, *positions) for a score per position); end the "
                             "model in a classifier (e.g. flatten and nn.Linear)")
    scores, positions = shapes[0], tuple(graph.input_shape[2:])
    per_position = labels_positions(dataset, PREPARED_DIR)
    if len(scores) == 2 and per_position:
        raise LayerwiseError(f"the {dataset} dataset labels every position but {model} "
                             f"outputs one score per class {tuple(scores)}; train a network "
                             "that scores every position (a U-Net's head, e.g. unet3d_seg) or "
                             "a dataset labelled per sample (synthetic)")
    if len(scores) > 2 and not per_position:
        raise LayerwiseError(f"{model} scores every position {tuple(scores)}, but the "
                             f"{dataset} dataset labels each sample once; use a dataset "
                             "labelled per position: segments (generated), or a prepared one "
                             "whose meta.json says \"targets\": \"positions\"")
    if len(scores) > 2 and tuple(scores[2:]) != positions:
        raise LayerwiseError(f"{model} scores positions {'x'.join(map(str, scores[2:]))} of "
                             f"an input of {'x'.join(map(str, positions))}, while the "
                             f"{dataset} dataset labels the input's own positions; end the "
                             "network at the input's resolution (its decoder's last "
                             "upsampling)")


def resumed_job(folder: Path, model: str, strategy: str | None, options: TrainOptions,
                out: Path | None, node_rank: int | None = None,
                rdzv_endpoint: str | None = None) -> Job:
    """The run in `folder` as it was defined; options given again must not change it. The
    folder is held from the first check on: a run still training in it is refused."""
    settings = TrainSettings.load(folder / SETTINGS_FILE)
    if out is not None and out.resolve() != folder.resolve():
        raise LayerwiseError(f"--resume continues in {folder}; drop --out {out}")
    repeated = {"model": model, **options.given_values(),
                **({"strategy": strategy} if strategy else {})}
    if isinstance(repeated.get("image_size"), tuple):  # --input-shape: settings keep squares
        repeated["image_size"] = compact_size(repeated["image_size"])  # as their side
    for key, value in repeated.items():
        if value != getattr(settings, key):
            raise LayerwiseError(
                f"--resume {folder} continues the same run: its {key} is "
                f"{getattr(settings, key)!r}, not {value!r}; drop that option or start a new run")
    endpoint = check_nodes(settings.nnodes, node_rank, rdzv_endpoint)
    with claim_existing_run(folder, node_rank or 0).released_on_error() as claim:
        return _resumed_job(settings, claim, node_rank or 0, endpoint)


def _resumed_job(settings: TrainSettings, claim: FolderClaim, node_rank: int,
                 rdzv_endpoint: Endpoint | None) -> Job:
    folder = claim.path
    graph = build_graph(settings.model, batch=settings.global_batch,
                        image_size=settings.image_size, num_classes=settings.classes,
                        in_channels=settings.in_channels)
    saved = Strategy.load(folder / STRATEGY_FILE)
    _check_strategy(saved, str(folder / STRATEGY_FILE), graph, settings.world)
    batches = _batches(settings)
    point = resume_point(folder / CHECKPOINT_FILE)
    if point is None:
        raise LayerwiseError(f"--resume {folder}: it holds no {CHECKPOINT_FILE} (the run "
                             "stopped before its first checkpoint, every --checkpoint-every "
                             "steps); train it again with a new --out")
    point.check_weights(_trained_weights(settings), settings.model)
    return Job(settings=settings, strategy=saved, graph=graph, batches=batches, claim=claim,
               checkpoint_step=point.step, checkpoint=point.path, node_rank=node_rank,
               rdzv_endpoint=rdzv_endpoint,
               warnings=(*_idle_warning(saved, settings.world),
                         *((point.note,) if point.note else ())))


def _trained_weights(settings: TrainSettings) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Name -> (shape, dtype) of the weights the run's workers train (built on the meta
    device: no memory), floating ones in the run's dtype as the workers make them."""
    module = build_model(settings.model, num_classes=settings.classes,
                         image_size=settings.image_size, in_channels=settings.in_channels,
                         device="meta")
    dtype = getattr(torch, settings.dtype)
    return {name: (tuple(tensor.shape), dtype if tensor.is_floating_point() else tensor.dtype)
            for name, tensor in module.state_dict().items()}


def total_steps(job: Job, steps: int | None, epochs: int | None) -> int:
    """The step the run trains until: `steps`, else `epochs` (default 1) over the data."""
    total = steps if steps is not None else (epochs or 1) * job.batches.steps_per_epoch
    done = job.checkpoint_step or 0
    if total <= done:
        raise LayerwiseError(f"the checkpoint in {job.out} is at step {done}; ask for more "
                             f"with --steps N (N > {done})")
    return total


def _given_or(value: int | None, fallback: int | None) -> int | None:
    return value if value is not None else fallback


def _resolve_strategy(spec: str, graph: LayerGraph, world: int, options: TrainOptions,
                      analytic: bool) -> Strategy:
    """The strategy `spec` names, checked against `graph`, with the cost model's prediction."""
    cluster = load_cluster(options.cluster)
    if cluster.num_devices < world:
        raise ConfigError(
            f"cluster '{cluster.name}' has {cluster.num_devices} devices, fewer than the {world} "
            f"processes; pass --cluster with at least {world} (e.g. a file written by "
            f"`layerwise calibrate --nproc {world}`)")
    profile = Path(options.profile) if options.profile else None
    cost = cost_model(graph, options.cluster, world, profile, analytic or profile is None)
    if spec in STRATEGY_NAMES:
        return strategy_by_name(spec, cost)
    if not Path(spec).is_file():
        raise LayerwiseError(f"--strategy {spec}: not a strategy name "
                             f"({', '.join(STRATEGY_NAMES)}) nor a strategy file")
    loaded = Strategy.load(spec)
    _check_strategy(loaded, spec, graph, world)
    try:
        return repriced(loaded, cost)
    except ConfigError as error:
        raise ConfigError(f"--strategy {spec}: {error}") from None


def _check_strategy(strategy: Strategy, source: str, graph: LayerGraph, world: int) -> None:
    """ConfigError (one line) unless the strategy's configs fit the model on `world`
    processes."""
    try:
        build_plan(graph, strategy.check_against(graph, world), world, strategy.recompute)
    except ConfigError as error:
        raise ConfigError(f"--strategy {source}: {error}") from None


def _idle_warning(strategy: Strategy, world: int) -> tuple[str, ...]:
    """A line when some processes hold no layer under `strategy`: the run is still correct
    (they take part in its collectives only), but they are wasted."""
    used = {device for config in strategy.assignment().values() for device in config.devices}
    idle = sorted(set(range(world)) - used)
    if not idle:
        return ()
    who = (f"rank {idle[0]} holds" if len(idle) == 1
           else f"ranks {', '.join(map(str, idle))} hold")
    return (f"strategy '{strategy.name}' gives layers to {len(used)} of the {world} processes: "
            f"{who} none and only wait (the run is still correct); train on {len(used)} "
            "processes to spare them",)


def _batches(settings: TrainSettings) -> GlobalBatches:
    """The run's batches: checks the dataset fits the model and holds a global batch."""
    data = load_dataset(settings.dataset, settings.image_size, settings.classes,
                        settings.in_channels, settings.seed, Path(settings.data_root))
    return GlobalBatches(data.train, settings.global_batch, settings.seed)


def claim_folder(out: Path | None, model: str, strategy: str,
                 node_rank: int = 0) -> FolderClaim:
    """`out` if it is new or empty, else a new folder under runs/ named after the run; held
    until released, so that no other launch can write into it meanwhile."""
    if out is not None:
        creatable_folder(out, "--out")
        return claim_new_folder(out, node_rank)
    name = Path(strategy).stem if strategy.endswith(".json") else strategy
    return claim_stamped_folder(RUNS_DIR, f"{model}-{name}")
