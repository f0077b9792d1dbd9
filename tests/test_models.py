"""The model zoo: parameter counts, shapes at 32x32, small-input stems, tracing, user models."""

from __future__ import annotations

import operator
import textwrap

import pytest
import torch
import torch.fx
from torch import nn

from layerwise.strategies.errors import LayerwiseError, UnknownModelError
from layerwise.strategies.model.graph import build_graph
from layerwise.strategies.model.zoo import (
    ZOO,
    ModelSpec,
    build_model,
    inception_v3,
    input_shape,
    min_image_size,
)

ZOO_NAMES = [
    "tiny_cnn", "lenet5", "wide_fc", "cosmoflow2d", "alexnet", "vgg16", "resnet18", "resnet50",
    "resnet101", "resnet152", "inception_v3", "cosmoflow3d", "unet3d", "unet3d_seg", "m5",
]
# the image classifiers, with their stems and minimum sizes (the 1-d and 3-d networks:
# tests/test_nd_layers.py)
IMAGE_MODELS = [name for name in ZOO_NAMES
                if name not in ("cosmoflow3d", "unet3d", "unet3d_seg", "m5")]

PARAMS_1000 = {  # torchvision's counts at 1000 classes (lenet5, wide_fc: 10; cosmoflow2d: 3)
    "alexnet": 61_100_840,
    "vgg16": 138_357_544,
    "resnet18": 11_689_512,
    "resnet50": 25_557_032,
    "resnet101": 44_549_160,
    "resnet152": 60_192_808,
    "inception_v3": 23_834_568,
    "lenet5": 61_706,
    "wide_fc": 8_417_994,
    "cosmoflow2d": 17_443,
}


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


# ---------------------------------------------------------------------------------------------
# The zoo table
# ---------------------------------------------------------------------------------------------


def test_zoo_order_and_specs() -> None:
    assert list(ZOO) == ZOO_NAMES
    for name, spec in ZOO.items():
        assert isinstance(spec, ModelSpec) and spec.name == name and spec.description
    assert (ZOO["lenet5"].in_channels, ZOO["lenet5"].image_size, ZOO["lenet5"].num_classes) == (
        1, 32, 10)
    assert ZOO["inception_v3"].image_size == 299 and ZOO["resnet50"].image_size == 224
    with pytest.raises(Exception):  # noqa: B017 - frozen pydantic model
        ZOO["resnet50"].image_size = 1  # type: ignore[misc]


@pytest.mark.parametrize("name", sorted(PARAMS_1000))
def test_parameter_counts(name: str) -> None:
    model = build_model(name, device="meta")
    assert all(p.is_meta for p in model.parameters())
    assert n_params(model) == PARAMS_1000[name]


def test_inception_aux_parameter_count() -> None:
    with torch.device("meta"):
        model = inception_v3(num_classes=1000, aux_logits=True)
    assert n_params(model) == 27_161_264
    assert type(model.AuxLogits).__name__ == "InceptionAux"


def test_explicit_num_classes_changes_only_the_head() -> None:
    a = shapes(build_model("resnet50", num_classes=10, device="meta"))
    b = shapes(build_model("resnet50", device="meta"))
    assert a["fc.weight"] == (10, 2048) and b["fc.weight"] == (1000, 2048)
    assert {k for k in a if a[k] != b[k]} == {"fc.weight", "fc.bias"}


def test_in_channels_changes_the_first_conv() -> None:
    model = build_model("resnet18", in_channels=1, device="meta")
    assert model.conv1.weight.shape == (64, 1, 7, 7)
    assert build_model("lenet5", device="meta").features[0].weight.shape == (6, 1, 5, 5)


def test_resnet_module_names() -> None:
    model = build_model("resnet50", device="meta")
    top = [name for name, _ in model.named_children()]
    assert top == ["conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4",
                   "avgpool", "fc"]
    block = model.layer2[0]
    assert [n for n, _ in block.named_children()] == [
        "conv1", "bn1", "conv2", "bn2", "conv3", "bn3", "relu", "downsample"]
    assert block.conv2.stride == (2, 2) and block.conv1.stride == (1, 1)  # v1.5
    assert all(m.bias is None for m in model.modules() if isinstance(m, nn.Conv2d))


# ---------------------------------------------------------------------------------------------
# Real forwards at 32x32
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_output_shape_at_32(name: str) -> None:
    torch.manual_seed(0)
    model = build_model(name, num_classes=10, image_size=32).eval()
    x = torch.randn(input_shape(name, 2, 32, None))
    with torch.no_grad():
        out = model(x)
    assert isinstance(out, torch.Tensor) and out.shape == (2, 10)
    assert torch.isfinite(out).all()


def test_inception_train_mode_at_32() -> None:
    model = build_model("inception_v3", num_classes=10, image_size=32).train()
    out = model(torch.randn(2, 3, 32, 32))
    assert isinstance(out, torch.Tensor) and out.shape == (2, 10)


def test_tiny_cnn_at_8() -> None:
    model = build_model("tiny_cnn", image_size=8).eval()
    with torch.no_grad():
        assert model(torch.randn(2, 3, 8, 8)).shape == (2, 10)


def test_inception_aux_returns_pair_in_training_only() -> None:
    with torch.device("meta"):
        model = inception_v3(num_classes=7, aux_logits=True)
    x = torch.empty(2, 3, 299, 299, device="meta")
    logits, aux = model.train()(x)
    assert logits.shape == (2, 7) and aux.shape == (2, 7)
    out = model.eval()(x)
    assert isinstance(out, torch.Tensor) and out.shape == (2, 7)


# ---------------------------------------------------------------------------------------------
# Small-input stems and minimum sizes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_small_input_keeps_parameter_shapes(name: str) -> None:
    small = build_model(name, image_size=32, device="meta")
    standard = build_model(name, device="meta")
    assert shapes(small) == shapes(standard)
    assert [n for n, _ in small.named_modules()] == [n for n, _ in standard.named_modules()]


def test_small_stems_change_only_strides() -> None:
    assert build_model("alexnet", image_size=32, device="meta").features[0].stride == (1, 1)
    assert build_model("alexnet", image_size=63, device="meta").features[0].stride == (4, 4)
    small = build_model("inception_v3", image_size=32, device="meta")
    standard = build_model("inception_v3", image_size=75, device="meta")
    assert small.Conv2d_1a_3x3.conv.stride == (1, 1) and small.maxpool1.stride == 1
    assert small.maxpool2.stride == 1
    assert standard.Conv2d_1a_3x3.conv.stride == (2, 2) and standard.maxpool2.stride == 2


def test_minimum_sizes_match_the_brief() -> None:
    assert (ZOO["alexnet"].min_standard_size, min_image_size("alexnet")) == (63, 21)
    assert (ZOO["inception_v3"].min_standard_size, min_image_size("inception_v3")) == (75, 17)
    assert min_image_size("vgg16") == 32 and min_image_size("resnet152") == 1


def _forward_meta(model: nn.Module, name: str, size: int) -> torch.Tensor:
    return model(torch.empty(input_shape(name, 1, size, None), device="meta"))


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_minimum_sizes_are_tight(name: str) -> None:
    """The computed minimum runs; one pixel less breaks the network (or the stem switches)."""
    for size in {min_image_size(name), ZOO[name].min_standard_size}:
        model = build_model(name, num_classes=3, image_size=size, device="meta").eval()
        assert _forward_meta(model, name, size).shape == (1, 3)
        if size > 1:  # the same network, one pixel smaller, must fail to run
            with pytest.raises(RuntimeError):
                _forward_meta(model, name, size - 1)


def test_too_small_image_size() -> None:
    with pytest.raises(UnknownModelError, match="needs at least 21 px"):
        build_model("alexnet", image_size=20, device="meta")
    with pytest.raises(UnknownModelError, match="needs at least 32 px"):
        build_model("vgg16", image_size=16, device="meta")
    with pytest.raises(UnknownModelError, match="needs at least 17 px"):
        build_model("inception_v3", image_size=16, device="meta")


def test_inception_aux_size_limits() -> None:
    with torch.device("meta"):
        with pytest.raises(UnknownModelError, match="aux_logits"):
            inception_v3(image_size=224, aux_logits=True)
        with pytest.raises(UnknownModelError, match="aux_logits"):
            inception_v3(image_size=32, aux_logits=True)
        model = inception_v3(num_classes=5, image_size=45, aux_logits=True).train()
    logits, aux = model(torch.empty(2, 3, 45, 45, device="meta"))
    assert logits.shape == aux.shape == (2, 5)


@pytest.mark.parametrize("kwargs", [{"num_classes": 0}, {"image_size": 0}, {"in_channels": -1},
                                    {"num_classes": 2.5}])
def test_non_positive_dimensions(kwargs: dict) -> None:
    with pytest.raises(UnknownModelError, match="positive integer"):
        build_model("resnet18", device="meta", **kwargs)


# ---------------------------------------------------------------------------------------------
# torch.fx
# ---------------------------------------------------------------------------------------------


def _count(graph: torch.fx.Graph, *targets: object) -> int:
    return sum(1 for n in graph.nodes if n.op == "call_function" and n.target in targets)


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_symbolic_trace_train_mode(name: str) -> None:
    model = build_model(name, device="meta").train()
    traced = torch.fx.symbolic_trace(model)
    adds = _count(traced.graph, operator.add, torch.add)
    blocks = {"resnet18": 8, "resnet50": 16, "resnet101": 33, "resnet152": 50, "tiny_cnn": 1}
    assert adds == blocks.get(name, 0)
    if name == "inception_v3":  # 11 mixed blocks + two inner joins in each InceptionE
        assert _count(traced.graph, torch.cat) == 11 + 4


@pytest.mark.parametrize("train", [True, False])
def test_symbolic_trace_inception_aux(train: bool) -> None:
    with torch.device("meta"):
        model = inception_v3(aux_logits=True).train(train)
    traced = torch.fx.symbolic_trace(model)
    called = {n.target for n in traced.graph.nodes if n.op == "call_module"}
    assert ("AuxLogits.fc" in called) is train


# ---------------------------------------------------------------------------------------------
# User models by reference
# ---------------------------------------------------------------------------------------------

USER_MODULE = textwrap.dedent(
    """
    import torch
    from torch import nn

    def with_classes(num_classes=4):
        return nn.Linear(8, num_classes)

    def with_everything(num_classes, image_size, in_channels):
        return nn.Conv2d(in_channels, num_classes, image_size)

    def with_kwargs(**kwargs):
        model = nn.Identity()
        model.seen = kwargs
        return model

    def no_args():
        return nn.Linear(2, 2)

    def not_a_module(num_classes=3):
        return [num_classes]

    def broken():
        raise RuntimeError("weights file missing")

    class Net(nn.Module):
        def __init__(self, num_classes: int = 2):
            super().__init__()
            self.fc = nn.Linear(3, num_classes)

    NOT_CALLABLE = 42

    class Backbone(nn.Module):  # as model libraries write one: no image_size argument

        def __init__(self, num_classes: int = 1000, in_channels: int = 3):
            super().__init__()
            self.conv = nn.Conv2d(in_channels, 8, 3)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(8, num_classes)

        def forward(self, x):
            return self.fc(torch.flatten(self.pool(self.conv(x)), 1))

    def builder(*, weights=None, progress=True, **kwargs) -> Backbone:
        # torchvision's builders: keyword-only weights, **kwargs handed to the class
        return Backbone(**kwargs)

    def unannotated_builder(**kwargs):
        return Backbone(**kwargs)

    class ComputedWidths(nn.Module):  # widths computed with torch at init, RegNet's way

        def __init__(self, num_classes: int = 3):
            super().__init__()
            width = int((torch.arange(3) * 4 + 4).tolist()[-1])
            self.conv = nn.Conv2d(3, width, 3)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(width, num_classes)

        def forward(self, x):
            return self.fc(torch.flatten(self.pool(self.conv(x)), 1))
    """
)


@pytest.fixture
def user_module(tmp_path, monkeypatch) -> str:
    name = f"user_models_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_user_factory_gets_accepted_kwargs(user_module: str) -> None:
    model = build_model(f"{user_module}:with_classes", num_classes=7, image_size=32)
    assert isinstance(model, nn.Linear) and model.out_features == 7
    assert build_model(f"{user_module}:with_classes").out_features == 4  # None is not passed
    conv = build_model(f"{user_module}:with_everything", num_classes=5, image_size=3,
                       in_channels=2)
    assert conv.weight.shape == (5, 2, 3, 3)
    seen = build_model(f"{user_module}:with_kwargs", num_classes=9, in_channels=1).seen
    assert seen == {"num_classes": 9, "in_channels": 1}
    assert isinstance(build_model(f"{user_module}:no_args", num_classes=3), nn.Linear)
    assert build_model(f"{user_module}:Net", num_classes=6).fc.out_features == 6


def test_a_builder_that_forwards_kwargs_gets_only_what_its_class_takes(user_module) -> None:
    """torchvision's `resnet18(**kwargs) -> ResNet` raised "unexpected keyword argument
    'image_size'": the class it is annotated to return names what it takes; without the
    annotation the argument it refuses is dropped and the call made again."""
    for factory in ("builder", "unannotated_builder"):
        model = build_model(f"{user_module}:{factory}", num_classes=5, image_size=16,
                            in_channels=1)
        assert model.fc.out_features == 5 and model.conv.in_channels == 1
        graph = build_graph(f"{user_module}:{factory}", batch=2, image_size=16, num_classes=5,
                            in_channels=1)
        assert graph.by_name[graph.outputs[0]].output_shape == (2, 5)


def test_a_reference_names_the_factorys_own_arguments(user_module) -> None:
    """A library's options (torchvision's aux_logits, MONAI's spatial_dims and channels) in
    the reference, as Python calls the factory; what it sets is not offered again."""
    model = build_model(f"{user_module}:builder(in_channels=2, num_classes=4)", num_classes=9,
                        in_channels=1)
    assert model.conv.in_channels == 2 and model.fc.out_features == 4
    graph = build_graph(f"{user_module}:builder( in_channels = 1 )", batch=2, image_size=8,
                        num_classes=5, in_channels=1)
    assert graph.by_name[graph.outputs[0]].output_shape == (2, 5)
    assert build_model(f"{user_module}:with_kwargs(extra=(1, 2), name='a:b')").seen == {
        "extra": (1, 2), "name": "a:b"}


@pytest.mark.parametrize(("arguments", "needle"), [
    ("(in_channel=2)", "takes no argument 'in_channel'"),
    ("(in_channels=2", "arguments Python cannot read"),
    ("(2)", "by keyword"),
    ("(**options)", "by keyword"),
    ("(in_channels=__import__('os').getpid())", "not a literal"),
    ("(in_channels=2) + 1", "by keyword"),
    ("(in_channels=\x002)", "arguments Python cannot read"),
    ("(" * 300 + ")" * 300, "arguments Python cannot read"),
])
def test_factory_arguments_a_reference_cannot_give_are_one_line(user_module, arguments,
                                                                 needle) -> None:
    with pytest.raises(UnknownModelError) as info:
        build_model(f"{user_module}:builder{arguments}")
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_a_model_whose_init_reads_tensors_is_planned_from_the_cpu(user_module) -> None:
    model = build_model(f"{user_module}:ComputedWidths", num_classes=4, device="meta")
    assert model.conv.weight.is_meta and model.conv.out_channels == 12
    assert build_graph(f"{user_module}:ComputedWidths", batch=2, image_size=8,
                       num_classes=4).by_name["fc"].output_shape == (2, 4)


def test_user_factory_on_meta(user_module: str) -> None:
    model = build_model(f"{user_module}:with_classes", num_classes=3, device="meta")
    assert model.weight.is_meta


@pytest.mark.parametrize(
    ("ref", "needle"),
    [
        ("no_such_module_xyz:factory", "cannot import module 'no_such_module_xyz'"),
        ("{mod}:missing", "has no attribute 'missing'"),
        ("{mod}:not_a_module", "not a torch.nn.Module"),
        ("{mod}:NOT_CALLABLE", "not callable"),
        ("{mod}:broken", "weights file missing"),
        ("{mod}:", "malformed"),
        (":factory", "malformed"),
    ],
)
def test_user_reference_errors(user_module: str, ref: str, needle: str) -> None:
    with pytest.raises(UnknownModelError) as info:
        build_model(ref.format(mod=user_module))
    message = str(info.value)
    assert needle in message and "\n" not in message


def test_unknown_zoo_name_lists_valid_names() -> None:
    with pytest.raises(UnknownModelError) as info:
        build_model("resnet51")
    message = str(info.value)
    assert "resnet51" in message and "package.module:factory" in message and "\n" not in message
    assert all(name in message for name in ZOO_NAMES)
    assert isinstance(info.value, LayerwiseError)


# ---------------------------------------------------------------------------------------------
# input_shape
# ---------------------------------------------------------------------------------------------


def test_input_shape_defaults() -> None:
    assert input_shape("resnet50", 8, None, None) == (8, 3, 224, 224)
    assert input_shape("inception_v3", 2, None, None) == (2, 3, 299, 299)
    assert input_shape("lenet5", 4, None, None) == (4, 1, 32, 32)
    assert input_shape(ZOO["tiny_cnn"], 1, 8, 1) == (1, 1, 8, 8)
    assert input_shape("pkg.mod:factory", 2, None, None) == (2, 3, 224, 224)
    assert input_shape("pkg.mod:factory", 2, 64, 1) == (2, 1, 64, 64)
    with pytest.raises(UnknownModelError):
        input_shape("nope", 1, None, None)
    with pytest.raises(LayerwiseError):
        input_shape("resnet50", 0, None, None)
