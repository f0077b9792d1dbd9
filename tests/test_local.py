"""Local parallelism (docs/research.md: local parallelism): blocks train on their own losses, as the
engine documents.

The engine runs on two real gloo processes (LeNet-5 cut after its first conv and pool); the
references are one-process re-implementations written here from the plain module, with the
same seed, batches, SGD and the engine's seeded auxiliary head:
- greedy: block 0 + its head trained on the head's loss; block 1 + the classifier trained on
  block 0's output of the same (pre-update) forward;
- overlapping: block 0 also gets block 1's gradient of batch t, through block 0's forward of
  batch t, in its update of step t+1.
The CLI run checks the worker's side: bytes against the prediction, a falling loss, model.pt.
Tests that start processes are marked slow.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cache

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from typer.testing import CliRunner

from layerwise.flows.cli import app
from layerwise.strategies.cost.compute_time import AnalyticCompute
from layerwise.strategies.cost.cost_model import CostModel
from layerwise.strategies.errors import ConfigError
from layerwise.strategies.hardware.cluster import load_cluster
from layerwise.strategies.model.graph import LayerGraph, build_graph, trace
from layerwise.strategies.model.zoo import build_model
from layerwise.strategies.runtime.engine_protocol import MODEL_STATE_KEY, EngineContext
from layerwise.strategies.schedules.local.engine import LocalEngine, auxiliary_heads
from layerwise.strategies.schedules.local.planner import (
    Cut,
    best_cuts,
    block_cuts,
    blocks_for,
    build_strategy,
    legal_cuts,
    local_strategy,
    predict,
)
from layerwise.strategies.strategy import Strategy
from layerwise.strategies.training_run import RunResult, TrainSettings
from tests.distributed import spawn_cases
from tests.idiom_models import ChannelsLastMlp

MODEL, SIZE, BATCH, STEPS, SEED = "lenet5", 16, 8, 3, 0
LR, MOMENTUM, WEIGHT_DECAY = 0.05, 0.9, 1e-4
CUT = "features_2"  # block 0: conv + ReLU + max-pool; block 1: the rest
BLOCK0 = ("features.0.weight", "features.0.bias")
CLOSE = {"rtol": 1e-5, "atol": 1e-6}


@cache
def _cost(devices: int, model: str = MODEL, size: int = SIZE, batch: int = BATCH) -> CostModel:
    graph = build_graph(model, batch=batch, image_size=size, num_classes=10)
    cluster = load_cluster("local")
    return CostModel(graph, cluster, devices, AnalyticCompute(cluster))


def _cuts(cost: CostModel) -> list[Cut]:
    return [cut for cut in legal_cuts(cost.graph) if cut.crossing == CUT]


def _strategy(name: str) -> Strategy:
    cost = _cost(2)
    return local_strategy(name, cost, _cuts(cost))


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1000)
    return [(torch.randn((BATCH, 1, SIZE, SIZE), generator=generator),
             torch.randint(0, 10, (BATCH,), generator=generator)) for _ in range(STEPS)]


def _module() -> torch.nn.Module:
    torch.manual_seed(SEED)
    return build_model(MODEL, num_classes=10, image_size=SIZE)


# ---- the engine on two processes -----------------------------------------------------------

@dataclass(frozen=True)
class Case:
    strategy: Strategy  # built in the parent: the processes need not trace the model
    graph: LayerGraph
    scale_classifier: float = 1.0  # rank 1 multiplies its last Linear's weights by this


@dataclass
class Outcome:
    losses: list[float]
    state: dict
    step_bytes: list[dict[tuple[str, str], int]]  # per step, summed over ranks


def _settings(name: str) -> TrainSettings:
    return TrainSettings(model=MODEL, strategy=name, nproc=2, nnodes=1, cluster="local",
                         profile=None, dataset="synthetic", data_root="data/prepared",
                         batch_per_device=BATCH // 2, image_size=SIZE, classes=10,
                         in_channels=1, lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY,
                         seed=SEED)


def _run_case(case: Case, rank: int, world: int) -> Outcome | None:
    module = _module()
    if rank == 1:
        with torch.no_grad():
            module.classifier[4].weight.mul_(case.scale_classifier)
    engine = LocalEngine(EngineContext(settings=_settings(case.strategy.name),
                                       strategy=case.strategy, graph=case.graph, module=module,
                                       rank=rank, world=world, device=torch.device("cpu")))
    losses, step_bytes = [], []
    for inputs, targets in _batches():
        engine.counter.reset()
        losses.append(engine.step(inputs, targets))
        step_bytes.append(engine.counter.reset())
    state = engine.training_state()
    gathered: list[list | None] = [None] * world
    dist.all_gather_object(gathered, step_bytes)
    if rank != 0:
        return None
    summed = [{key: sum(ranks[step].get(key, 0) for ranks in gathered if ranks)
               for key in {key for ranks in gathered if ranks for key in ranks[step]}}
              for step in range(STEPS)]
    return Outcome(losses=losses, state=state or {}, step_bytes=summed)


CASES = {"greedy": ("local", 1.0), "perturbed": ("local", 3.0),
         "overlapping": ("local_overlap", 1.0)}


@pytest.fixture(scope="module")
def outcomes() -> dict[str, Outcome]:
    """Every case on one launch of two gloo processes (starting them costs seconds)."""
    cases = [Case(_strategy(name), _cost(2).graph, scale) for name, scale in CASES.values()]
    return dict(zip(CASES, spawn_cases(_run_case, cases, 2, __name__), strict=True))


# ---- the one-process re-implementations ----------------------------------------------------

def reference(overlapping: bool) -> tuple[list[float], dict, dict, list[torch.Tensor]]:
    """(model losses, plain state, head state, block 0's pending delayed gradient)."""
    module = _module()
    cost = _cost(2)
    head = auxiliary_heads(cost.graph, _cuts(cost), SEED)[0]
    first = module.features[:3]

    def second(activation: torch.Tensor) -> torch.Tensor:
        features = module.avgpool(module.features[3:](activation))
        return module.classifier(torch.flatten(features, 1))

    def sgd(parameters) -> torch.optim.SGD:
        return torch.optim.SGD(list(parameters), lr=LR, momentum=MOMENTUM,
                               weight_decay=WEIGHT_DECAY)

    first_sgd = sgd([*first.parameters(), *head.parameters()])
    second_sgd = sgd([*module.features[3:].parameters(), *module.classifier.parameters()])
    losses, delayed = [], []
    for inputs, targets in _batches():
        activation = first(inputs)
        received = activation.detach().requires_grad_()
        model_loss = F.cross_entropy(second(received), targets)
        F.cross_entropy(head(activation), targets).backward(retain_graph=True)
        model_loss.backward()
        if overlapping:  # block 1's gradient of this batch, applied at the next step
            previous = delayed
            delayed = list(torch.autograd.grad(activation, list(first.parameters()),
                                               received.grad))
            for parameter, gradient in zip(first.parameters(), previous, strict=False):
                parameter.grad = parameter.grad + gradient
        first_sgd.step()
        second_sgd.step()
        first_sgd.zero_grad()
        second_sgd.zero_grad()
        losses.append(float(model_loss.detach()))
    return losses, module.state_dict(), head.state_dict(), delayed


def check_state(outcome: Outcome, overlapping: bool) -> None:
    losses, state, head, delayed = reference(overlapping)
    torch.testing.assert_close(torch.tensor(outcome.losses), torch.tensor(losses), **CLOSE)
    trained = outcome.state[MODEL_STATE_KEY]
    assert trained.keys() == state.keys()
    for key, value in state.items():
        torch.testing.assert_close(trained[key], value, **CLOSE, msg=key)
    for name, value in head.items():
        torch.testing.assert_close(outcome.state["aux"][f"0.{name}"], value, **CLOSE)
    pending = outcome.state["pending"]
    assert list(pending) == (list(BLOCK0) if overlapping else [])
    for key, gradient in zip(BLOCK0, delayed, strict=False):
        torch.testing.assert_close(pending[key], gradient, **CLOSE)


@pytest.mark.slow
def test_greedy_blocks_train_on_their_own_losses(outcomes):
    check_state(outcomes["greedy"], overlapping=False)
    assert set(outcomes["greedy"].state["momentum"]) == {
        *BLOCK0, "aux.0.weight", "aux.0.bias", "features.3.weight", "features.3.bias",
        *(f"classifier.{i}.{p}" for i in (0, 2, 4) for p in ("weight", "bias"))}


@pytest.mark.slow
def test_no_gradient_crosses_a_block_boundary_in_greedy(outcomes):
    greedy = outcomes["greedy"].state[MODEL_STATE_KEY]
    perturbed = outcomes["perturbed"].state[MODEL_STATE_KEY]
    for key in BLOCK0:
        assert torch.equal(perturbed[key], greedy[key]), key
    assert not torch.allclose(perturbed["classifier.4.weight"], greedy["classifier.4.weight"])
    assert outcomes["perturbed"].losses != outcomes["greedy"].losses


@pytest.mark.slow
def test_overlapping_adds_the_next_blocks_gradient_one_step_late(outcomes):
    check_state(outcomes["overlapping"], overlapping=True)
    greedy = outcomes["greedy"].state[MODEL_STATE_KEY]
    overlapping = outcomes["overlapping"].state[MODEL_STATE_KEY]
    assert not torch.allclose(overlapping["features.0.weight"], greedy["features.0.weight"])
    # step 1 has no delayed gradient yet: both variants return the same first loss
    assert outcomes["overlapping"].losses[0] == outcomes["greedy"].losses[0]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["greedy", "overlapping"])
def test_the_engine_sends_the_predicted_bytes(outcomes, case):
    predicted = _strategy(CASES[case][0]).predicted
    activation = BATCH * 6 * 6 * 6 * 4  # features_2's output, fp32
    assert predicted.transfer_bytes == activation * (2 if case == "overlapping" else 1)
    assert predicted.sync_bytes == 0
    for counts in outcomes[case].step_bytes:
        assert sum(n for (_, category), n in counts.items()
                   if category == "transfer") == predicted.transfer_bytes
        assert counts[("loss", "loss")] == 4


class DropoutNet(torch.nn.Module):
    """Conv-BN-ReLU with per-channel dropout, then dropout before the classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.relu = torch.nn.ReLU()
        self.channels = torch.nn.Dropout2d(0.25)
        self.drop = torch.nn.Dropout(0.5)
        self.fc = torch.nn.Linear(4 * SIZE * SIZE, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.channels(self.relu(self.bn(self.conv(x))))
        return self.fc(self.drop(torch.flatten(x, 1)))


def test_one_block_is_global_backprop_with_one_devices_dropout_masks():
    """K = 1: no head, nothing sent; the masks are the ones torch draws on one device."""
    torch.manual_seed(SEED)
    graph = trace(DropoutNet(), (BATCH, 1, SIZE, SIZE), name="dropout_net")
    cluster = load_cluster("local")
    strategy = local_strategy("local", CostModel(graph, cluster, 1, AnalyticCompute(cluster)),
                              [])
    torch.manual_seed(SEED)
    engine = LocalEngine(EngineContext(settings=_settings("local"), strategy=strategy,
                                       graph=graph, module=DropoutNet(), rank=0, world=1,
                                       device=torch.device("cpu")))
    torch.manual_seed(SEED)
    plain = DropoutNet()
    sgd = torch.optim.SGD(plain.parameters(), lr=LR, momentum=MOMENTUM,
                          weight_decay=WEIGHT_DECAY)
    torch.manual_seed(1)  # the masks of both runs start from this generator state
    expected = []
    for inputs, targets in _batches():
        loss = F.cross_entropy(plain(inputs), targets)
        loss.backward()
        sgd.step()
        sgd.zero_grad()
        expected.append(float(loss.detach()))
    torch.manual_seed(1)
    losses = [engine.step(inputs, targets) for inputs, targets in _batches()]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), **CLOSE)
    state = engine.training_state()
    assert state is not None and engine.counter.reset() == {}
    for key, value in plain.state_dict().items():
        torch.testing.assert_close(state[MODEL_STATE_KEY][key], value, **CLOSE, msg=key)


# ---- partition and prediction --------------------------------------------------------------

def test_the_partition_is_the_best_under_the_prediction():
    for devices, name in itertools.product((2, 3), ("local", "local_overlap")):
        cost = _cost(devices, batch=32)
        overlapping = name == "local_overlap"
        cuts = legal_cuts(cost.graph)
        every = [predict(cost, chosen, overlapping).step_seconds
                 for chosen in itertools.combinations(cuts, devices - 1)]
        chosen = best_cuts(cost, overlapping)
        assert predict(cost, chosen, overlapping).step_seconds == pytest.approx(min(every))
        strategy = build_strategy(name, cost)
        assert [block.device for block in strategy.execution.blocks] == list(range(devices))
        assert {choice.config for choice in strategy.layers} == {
            f"n1c1h1w1@{device}" for device in range(devices)}


def test_more_blocks_than_cut_points_is_one_config_error():
    cost = _cost(8, model="tiny_cnn", size=8)  # 6 legal cuts: at most 7 blocks
    with pytest.raises(ConfigError, match="6 legal cut point.*at most 7 blocks"):
        build_strategy("local", cost)
    result = CliRunner().invoke(app, ["train", "tiny_cnn", "--strategy", "local", "--nproc",
                                      "8", "--image-size", "8", "--batch-per-device", "2"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "legal cut point" in lines[0], result.stderr


def test_blocks_cut_inside_a_residual_block_are_refused():
    graph = _cost(2, model="tiny_cnn", size=8).graph
    inside = [index for index, layer in enumerate(graph.layers) if layer.name == "block_conv1"]
    blocks = blocks_for(graph, [Cut(position=inside[0], crossing="block_conv1")])
    with pytest.raises(ConfigError, match="more than one tensor crosses"):
        block_cuts(graph, blocks, 2)
    with pytest.raises(ConfigError, match="2 blocks but the run has 3"):
        block_cuts(graph, blocks, 3)


def _run_channels_last(case: tuple[Strategy, LayerGraph], rank: int, world: int) -> float:
    strategy, graph = case
    torch.manual_seed(SEED)
    module = ChannelsLastMlp()
    settings = _settings("local").model_copy(update={
        "model": "tests.idiom_models:ChannelsLastMlp", "image_size": 8, "classes": 4,
        "in_channels": 3})
    engine = LocalEngine(EngineContext(settings=settings, strategy=strategy, graph=graph,
                                       module=module, rank=rank, world=world,
                                       device=torch.device("cpu")))
    generator = torch.Generator().manual_seed(1000)
    loss = engine.step(torch.randn((4, 3, 8, 8), generator=generator),
                       torch.randint(0, 4, (4,), generator=generator))
    engine.barrier()  # the last block's loss reaches rank 0 before either process exits
    return loss


def test_blocks_never_end_inside_a_channels_last_run():
    """After the permute into channels-last the model's tensors are (N, H, W, C) until the
    permute back: a block ending there would hand its head and the next block the wrong
    layout, so those layers are no cut points, and blocks that end there are refused."""
    graph = build_graph("tests.idiom_models:ChannelsLastMlp", batch=4, image_size=8,
                        num_classes=4)
    assert [layer.name for layer in graph.layers if layer.channels_last_value] == [
        "conv", "expand"]
    assert [cut.crossing for cut in legal_cuts(graph)] == ["project", "mean"]
    inside = next(index for index, layer in enumerate(graph.layers) if layer.name == "expand")
    with pytest.raises(ConfigError, match="channels-last"):
        block_cuts(graph, blocks_for(graph, [Cut(position=inside, crossing="expand")]), 2)
    cluster = load_cluster("local")
    strategy = build_strategy("local", CostModel(graph, cluster, 2, AnalyticCompute(cluster)))
    (loss,) = spawn_cases(_run_channels_last, [(strategy, graph)], 2, __name__)
    assert torch.isfinite(torch.tensor(loss))


# ---- the CLI and the worker ----------------------------------------------------------------

@pytest.mark.slow
def test_local_training_through_the_cli(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", "tiny_cnn", "--strategy", "local", "--nproc",
                                      "2", "--steps", "20", "--image-size", "16",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "execution: local updates (greedy), 2 block(s)" in result.output
    run = RunResult.load(out / "result.json")
    assert run.bytes_per_step == run.predicted_bytes_per_step
    assert run.bytes_per_step.transfer > 0 and run.loss_bytes_per_step == 4
    losses = torch.tensor([step.loss for step in run.steps])
    assert torch.isfinite(losses).all()
    assert losses[-5:].mean() < losses[:5].mean()
    module = build_model("tiny_cnn", num_classes=10, image_size=16)
    module.load_state_dict(torch.load(out / "model.pt", weights_only=True), strict=True)
