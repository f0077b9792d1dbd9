"""Layer graph: edges, shapes, fusion, geometry, FLOPs, side effects and errors."""

from __future__ import annotations

import textwrap

import pytest
import torch
from torch import nn

from layerwise.strategies.errors import GraphError
from layerwise.strategies.model.graph import build_graph, trace
from layerwise.strategies.model.zoo import ZOO, build_model


@pytest.fixture(scope="module")
def resnet18_graph():
    return build_graph("resnet18", batch=2, image_size=32, num_classes=10)


@pytest.fixture(scope="module")
def inception_graph():
    return build_graph("inception_v3", batch=2)


def test_resnet_residual_adds_are_layers_with_two_inputs(resnet18_graph):
    adds = [layer for layer in resnet18_graph.layers if layer.kind == "add"]
    assert len(adds) == 8  # one per BasicBlock: [2, 2, 2, 2]
    for add in adds:
        assert len(add.inputs) == 2
        assert add.label == "add+ReLU"  # the block's final ReLU is fused into the add
        producers = [resnet18_graph.by_name[name] for name in add.inputs]
        assert all(p.output_shape == add.output_shape for p in producers)
    first = adds[0]
    # layer1's first block adds conv2+bn2 to the block input (the stem's max-pool)
    assert set(first.inputs) == {"layer1_0_conv2", "maxpool"}
    downsampled = next(a for a in adds if "layer2_0_downsample_0" in a.inputs)
    assert downsampled.inputs == ("layer2_0_conv2", "layer2_0_downsample_0")


def test_resnet_graph_shapes_params_and_edges(resnet18_graph):
    graph = resnet18_graph
    assert graph.input_shape == (2, 3, 32, 32)
    assert graph.outputs == ("fc",)
    assert graph.by_name["fc"].output_shape == (2, 10)
    module = build_model("resnet18", num_classes=10, image_size=32, device="meta")
    assert graph.param_count == sum(p.numel() for p in module.parameters())
    for producer, consumer in graph.edges:
        assert producer in graph.consumers and consumer in graph.consumers[producer]
    names = [layer.name for layer in graph.layers]
    for layer in graph.layers:  # topological order
        assert all(names.index(source) < names.index(layer.name) for source in layer.inputs)


def test_inception_concatenations_join_their_branches(inception_graph):
    concats = [layer for layer in inception_graph.layers if layer.kind == "concat"]
    assert len(concats) == 15  # 3 InceptionA, B, 4 C, D, and 3 per InceptionE (2 inner + 1)
    mixed_5b = next(c for c in concats if c.output_shape[1] == 256)
    assert len(mixed_5b.inputs) == 4
    assert mixed_5b.concat_dim == 1
    assert sum(shape[1] for shape in mixed_5b.input_shapes) == 256
    assert inception_graph.by_name["fc"].output_shape == (2, 1000)
    assert inception_graph.param_count == 23_834_568


@pytest.mark.parametrize("name", list(ZOO))
def test_every_zoo_model_builds_a_graph_whose_params_match_the_module(name):
    size = 32 if name not in ("lenet5", "m5") else None  # m5: signals of 1024 samples and up
    graph = build_graph(name, batch=2, image_size=size, num_classes=10)
    module = build_model(name, num_classes=10, image_size=size, device="meta")
    assert graph.param_count == sum(p.numel() for p in module.parameters())
    assert graph.layers[0].kind == "input"
    scores = graph.input_shape[2:] if name == "unet3d_seg" else ()  # one per voxel
    assert graph.by_name[graph.outputs[0]].output_shape == (2, 10, *scores)


def test_conv_geometry_and_flops_are_exact():
    model = nn.Sequential(
        nn.Conv2d(4, 6, kernel_size=(3, 5), stride=2, padding=(1, 2), dilation=(1, 2),
                  groups=2),
        nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True),
        nn.Flatten(),
        nn.Linear(6 * 5 * 3, 5, bias=False),
    )
    graph = trace(model, (3, 4, 16, 12))
    conv, pool, _, fc = graph.layers[1:]
    assert conv.geometry.kernel == (3, 5) and conv.geometry.stride == (2, 2)
    assert conv.geometry.padding == (1, 2) and conv.geometry.dilation == (1, 2)
    assert conv.geometry.groups == 2
    n, c, h, w = conv.output_shape
    assert (n, c, h, w) == (3, 6, 8, 4)
    # 2 FLOPs per multiply-add over (in_channels / groups) * kh * kw inputs, plus the bias add
    assert conv.flops == 2 * (n * c * h * w) * (2 * 3 * 5) + n * c * h * w
    assert pool.geometry.ceil_mode and pool.geometry.padding == (1, 1)
    assert pool.output_shape == (3, 6, 5, 3)  # ceil mode keeps a 5th row
    assert pool.flops == 3 * 6 * 5 * 3 * 9
    assert fc.kind == "linear" and fc.flops == 2 * 3 * 5 * 90


def test_resnet50_forward_cost_matches_the_published_4_1_gmacs():
    graph = build_graph("resnet50", batch=1)
    macs = sum(layer.flops for layer in graph.layers if layer.kind in ("conv", "linear")) / 2
    assert macs == pytest.approx(4.09e9, rel=0.02)


class _Shared(nn.Module):
    """An elementwise op after the input, and one whose producer has two consumers."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(x)
        y = self.conv(x)
        return self.bn(y) + y


def test_fusion_only_into_a_sole_consumer_that_is_not_the_input():
    graph = trace(_Shared(), (2, 3, 8, 8))
    kinds = {layer.name: layer.kind for layer in graph.layers}
    assert kinds["relu"] == "elementwise"  # follows the network input: kept as a layer
    assert kinds["bn"] == "elementwise"  # conv feeds both bn and the add: not fused
    assert graph.by_name["add"].inputs == ("bn", "conv")


def test_tracing_a_real_module_leaves_its_state_untouched():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Dropout())
    model.eval()
    before = {key: value.clone() for key, value in model.state_dict().items()}
    graph = trace(model, (2, 3, 10, 10))
    assert not model.training
    after = model.state_dict()
    assert all(torch.equal(before[key], after[key]) for key in before)
    assert graph.layers[1].label == "Conv2d+BatchNorm2d+ReLU+Dropout"
    assert set(graph.layers[1].param_shapes) == {"weight", "bias", "1.weight", "1.bias"}


def test_structure_hash_ignores_batch_but_not_structure():
    small = build_graph("tiny_cnn", batch=2)
    large = build_graph("tiny_cnn", batch=64)
    other_classes = build_graph("tiny_cnn", batch=2, num_classes=7)
    assert small.structure_hash == large.structure_hash
    assert small.structure_hash != other_classes.structure_hash


def test_user_model_by_reference(tmp_path, monkeypatch):
    (tmp_path / "my_nets.py").write_text(textwrap.dedent("""
        from torch import nn

        def make(num_classes=3):
            return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                 nn.Flatten(), nn.Linear(8, num_classes))
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = build_graph("my_nets:make", batch=4, image_size=16, num_classes=5)
    assert [layer.kind for layer in graph.layers] == [
        "input", "conv", "adaptive_pool", "flatten", "linear"
    ]
    assert graph.by_name[graph.outputs[0]].output_shape == (4, 5)


class _DataDependent(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x
        return -x


def test_untraceable_model_names_the_failing_call():
    with pytest.raises(GraphError) as error:
        trace(_DataDependent(), (1, 3, 4, 4))
    message = str(error.value)
    assert "\n" not in message
    assert "test_graph.py" in message and "if x.sum() > 0" in message


class _MatMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(x, x)


def test_unsupported_operation_names_the_node():
    with pytest.raises(GraphError, match="'matmul'.*function matmul"):
        trace(_MatMul(), (1, 3, 4, 4))


def test_wrong_input_size_is_a_clear_error():
    with pytest.raises(GraphError, match="fails on input"):
        trace(nn.Linear(10, 2), (2, 3))
    with pytest.raises(GraphError, match="batch must be >= 1"):
        build_graph("tiny_cnn", batch=0)


class _SkipWhenGiven(nn.Module):
    """A decoder step as MONAI's UpCat writes it: the skip input is concatenated when a check
    on it says it is a tensor (`torch.jit.isinstance`), or, `builtin`, Python's isinstance,
    which fx cannot answer for a traced value."""

    def __init__(self, builtin: bool = False) -> None:
        super().__init__()
        self.builtin = builtin
        self.down = nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose2d(4, 4, 2, stride=2)
        self.merge = nn.Conv2d(7, 2, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up = self.up(self.down(x))
        given = isinstance(x, torch.Tensor) if self.builtin else torch.jit.isinstance(
            x, torch.Tensor)
        return self.merge(torch.cat([x, up], dim=1) if given else up)


def test_a_skip_taken_when_torch_jit_isinstance_says_tensor_is_traced_with_it():
    graph = trace(_SkipWhenGiven(), (2, 3, 8, 8))
    assert graph.by_name["merge"].inputs == ("cat",)
    assert graph.by_name["cat"].inputs == ("x", "up")
    assert torch.jit.isinstance(torch.zeros(1), torch.Tensor)  # restored after tracing


def test_a_traced_graph_that_fails_where_the_model_runs_says_fx_took_another_branch():
    with pytest.raises(GraphError) as error:
        trace(_SkipWhenGiven(builtin=True), (2, 3, 8, 8))
    message = str(error.value)
    assert "\n" not in message and "while the model itself runs on it" in message
    assert "torch.fx.wrap" in message
