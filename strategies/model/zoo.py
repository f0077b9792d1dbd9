"""The model zoo: the CNNs of the papers layerwise implements, plus user models by reference.

Every zoo network reproduces torchvision's layer structure, module names and parameter counts
(written here from the papers' architecture tables, not imported: torchvision is not a
dependency). `build_model` builds a zoo network by name, or a user's own network given as
``package.module:factory``.

Small-input stems. Tests and fast training run every model at 32x32. ResNet and VGG handle that
unchanged, but AlexNet's stem (stride-4 11x11 conv, three 3x3/2 max-pools) needs at least 63 px
and Inception-v3's (three stride-2 stem layers before Mixed_5b) at least 75 px. Below that
minimum the factory builds a *small-input stem*: the same layers with the same kernels, only
the stride of the stem layers that would shrink the image to nothing set to 1 (AlexNet:
``features[0]``; Inception-v3: ``Conv2d_1a_3x3``, ``maxpool1``, ``maxpool2``). Strides hold no
parameters, so the parameter shapes and counts and the layer graph stay the paper's; only the
spatial reduction of the stem changes. Which stem a size gets is a pure function of the size:
``image_size < ZOO[name].min_standard_size`` means the small one.

ReLUs are out-of-place (torchvision uses ``inplace=True``): the layer graph, hooks and split
execution may keep a layer's input and output alive at the same time.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import re
import typing
from collections.abc import Callable, Iterator
from typing import Any

import pydantic
import torch
import torch.nn.functional as F
from torch import nn

from layerwise.strategies.errors import LayerwiseError, UnknownModelError
from layerwise.strategies.model.factory_arguments import split_reference
from layerwise.strategies.model.input_size import InputSize, compact_size, spatial_size
from layerwise.strategies.model.zoo_nd import (
    cosmoflow3d,
    field_classifier,
    m5,
    unet3d,
    unet3d_seg,
)

__all__ = [
    "ZOO",
    "AlexNet",
    "BasicBlock",
    "BasicConv2d",
    "CosmoFlow2D",
    "Bottleneck",
    "Inception3",
    "InceptionA",
    "InceptionAux",
    "InceptionB",
    "InceptionC",
    "InceptionD",
    "InceptionE",
    "LeNet5",
    "ModelSpec",
    "ResNet",
    "TinyCNN",
    "VGG",
    "WideFC",
    "alexnet",
    "build_model",
    "cosmoflow2d",
    "inception_v3",
    "input_shape",
    "lenet5",
    "min_image_size",
    "resnet18",
    "resnet50",
    "resnet101",
    "resnet152",
    "tiny_cnn",
    "vgg16",
    "wide_fc",
]

USER_DEFAULT_CHANNELS = 3
USER_DEFAULT_IMAGE_SIZE = 224



class ModelSpec(pydantic.BaseModel, frozen=True):
    """What the zoo knows about one network before building it."""

    name: str  # zoo name, e.g. "resnet50"
    description: str  # one line
    in_channels: int  # default input channels
    image_size: int  # default input side along each spatial dim
    spatial_dims: int = 2  # 1: (N, C, L) signals, 2: images, 3: (N, C, D, H, W) volumes
    num_classes: int  # default number of classes
    min_standard_size: int  # smallest input that uses the standard (torchvision) stem


# --------------------------------------------------------------------------------------------
# Spatial size bookkeeping: which input sizes each network (and stem) accepts.
# --------------------------------------------------------------------------------------------

_Op = tuple[int, int, int]  # (kernel, stride, padding) of one layer that shrinks the image
_SMALL_STEM_MODELS = frozenset({"alexnet", "inception_v3"})


def _paths(name: str, small: bool, aux: bool = False) -> list[list[_Op]]:
    """The size-reducing layers along each path from the input to a global pool.

    Layers that keep the size (padded 3x3 convs, 1x1 convs, stride-1 pools) are left out.
    """
    if name == "tiny_cnn":
        return [[(3, 2, 1), (2, 2, 0)]]
    if name == "lenet5":
        return [[(5, 1, 0), (2, 2, 0), (5, 1, 0), (2, 2, 0)]]
    if name == "wide_fc":
        return [[(2, 2, 0), (2, 2, 0)]]
    if name == "cosmoflow2d":
        return [[(2, 2, 0)] * 3]
    if name == "alexnet":
        return [[(11, 1 if small else 4, 2), (3, 2, 0), (3, 2, 0), (3, 2, 0)]]
    if name == "vgg16":
        return [[(2, 2, 0)] * 5]
    if name.startswith("resnet"):
        return [[(7, 2, 3)] + [(3, 2, 1)] * 4]
    if name == "inception_v3":
        s = 1 if small else 2  # Conv2d_1a_3x3, Conv2d_2a_3x3, maxpool1, Conv2d_4a_3x3, ...
        to_6e = [(3, s, 0), (3, 1, 0), (3, s, 0), (3, 1, 0), (3, s, 0), (3, 2, 0)]
        paths = [[*to_6e, (3, 2, 0)]]  # ... maxpool2, Mixed_6a, Mixed_7a
        if aux:  # AuxLogits: avg_pool2d(5, stride 3), then an unpadded 5x5 conv
            paths.append([*to_6e, (5, 3, 0), (5, 1, 0)])
        return paths
    raise KeyError(name)


def _min_input(paths: list[list[_Op]]) -> int:
    """Smallest input size whose output is at least 1x1 on every path.

    A layer's output ``(h + 2p - k) // s + 1`` is >= n exactly when ``h >= (n - 1) s + k - 2p``,
    so walking a path backwards from n = 1 gives the exact minimum.
    """
    need = 1
    for path in paths:
        n = 1
        for k, s, p in reversed(path):
            n = max(1, (n - 1) * s + k - 2 * p)
        need = max(need, n)
    return need


def _spec_for(name: Any) -> ModelSpec:
    if isinstance(name, ModelSpec):
        return name
    if isinstance(name, str) and name in ZOO:
        return ZOO[name]
    raise UnknownModelError(
        f"unknown model {name!r}: the zoo has {', '.join(ZOO)}; give your own model as "
        "package.module:factory (a function or class that returns a torch.nn.Module)"
    )


def min_image_size(name_or_spec: str | ModelSpec) -> int:
    """Smallest input side (height = width, or along each spatial dim of a 1-d or 3-d model)
    a zoo model accepts (with its small-input stem if any)."""
    spec = _spec_for(name_or_spec)
    if spec.spatial_dims != 2:
        return spec.min_standard_size
    return _min_input(_paths(spec.name, small=spec.name in _SMALL_STEM_MODELS))


def _check_positive(**values: InputSize | None) -> None:
    for what, value in values.items():
        if value is None:
            continue
        entries = value if isinstance(value, tuple) and what == "image_size" else (value,)
        if not entries or any(isinstance(entry, bool) or not isinstance(entry, int) or entry < 1
                              for entry in entries):
            raise UnknownModelError(f"{what} must be a positive integer, got {value!r}")


def _prepare(name: str, num_classes: int, image_size: int, in_channels: int,
             aux: bool = False) -> bool:
    """Validate a zoo factory's arguments; return True when it needs the small-input stem."""
    _check_positive(num_classes=num_classes, image_size=image_size, in_channels=in_channels)
    small = name in _SMALL_STEM_MODELS and image_size < _min_input(_paths(name, small=False))
    need = _min_input(_paths(name, small))
    if image_size < need:
        stem = " even with its small-input stem" if name in _SMALL_STEM_MODELS else ""
        raise UnknownModelError(
            f"{name} needs at least {need} px input{stem}, got image_size={image_size}: "
            f"use a bigger image_size"
        )
    if aux:
        need_aux = _min_input(_paths(name, small, aux=True))
        if image_size < need_aux:
            raise UnknownModelError(
                f"{name} with aux_logits=True needs a 17x17 Mixed_6e map for its auxiliary "
                f"head, which image_size={image_size} does not give (it needs at least "
                f"{need_aux} px with the {'small-input' if small else 'standard'} stem): "
                "use aux_logits=False or image_size >= 299"
            )
    return small


# --------------------------------------------------------------------------------------------
# Tiny CNN and LeNet-5
# --------------------------------------------------------------------------------------------


class TinyCNN(nn.Module):
    """A small CNN for fast tests: two conv-BN-ReLU layers, a max-pool, one residual block."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.relu2 = nn.ReLU()
        self.maxpool = nn.MaxPool2d(2)
        self.block = BasicBlock(16, 16)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu1(self.bn1(self.conv1(x)))
        x = self.relu2(self.bn2(self.conv2(x)))
        x = self.block(self.maxpool(x))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


class LeNet5(nn.Module):
    """LeNet-5 (LeCun et al. 1998) in its common modern form: ReLU and max-pooling.

    ``avgpool`` (adaptive, to 5x5, no parameters) is the identity at 32x32 and lets larger
    inputs reach the 400-wide classifier.
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 1) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((5, 5))
        self.classifier = nn.Sequential(
            nn.Linear(16 * 5 * 5, 120), nn.ReLU(),
            nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(self.avgpool(self.features(x)), 1)
        return self.classifier(x)


class WideFC(nn.Module):
    """Two small convolutions, then three wide fully connected layers: AlexNet's shape in
    miniature, where Krizhevsky's argument for OWT holds (docs/research.md: OWT): the convolutions
    hold 0.06% of the 8.4M weights, the FC layers the rest, so data parallelism all-reduces 34 MB of
    FC gradients per step while a channel split of the FC layers moves a 0.5 MB activation.

    ``avgpool`` (adaptive, to 8x8, no parameters) is the identity at 32x32 and lets larger
    inputs reach the 2048-wide classifier.
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 1, width: int = 2048) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((8, 8))
        self.classifier = nn.Sequential(
            nn.Linear(32 * 8 * 8, width), nn.ReLU(),
            nn.Linear(width, width), nn.ReLU(),
            nn.Linear(width, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(self.avgpool(self.features(x)), 1)
        return self.classifier(x)


class CosmoFlow2D(nn.Module):
    """A high-resolution field classifier in the shape of CosmoFlow (Mathuriya et al., SC'18),
    in two dimensions: convolution stages that widen as average pools halve a large field, leaky
    ReLUs and no BatchNorm, then a global pool and two fully connected layers.

    Its activations, not its 17K weights, fill a device: at 256x256 one sample's first
    activation is 2 MB against 0.07 MB of weights, so past a sample per device only height and
    width splits spread it. Without BatchNorm it trains at one sample per step (BatchNorm over
    one sample is a per-sample normalisation that removes the field's variance, the very signal
    of the `fields` dataset); He initialisation for the leaky ReLUs keeps the signal's scale
    through the stages instead.
    """

    def __init__(self, num_classes: int = 3, in_channels: int = 1, width: int = 8) -> None:
        super().__init__()
        self.features, self.avgpool, self.classifier = field_classifier(
            2, in_channels, (width, 2 * width, 4 * width, 4 * width), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(self.avgpool(self.features(x)), 1)
        return self.classifier(x)




# --------------------------------------------------------------------------------------------
# AlexNet and VGG
# --------------------------------------------------------------------------------------------


class AlexNet(nn.Module):
    """AlexNet, single-tower variant (Krizhevsky 2014, "One weird trick"; Krizhevsky et al. 2012).

    ``small_stem`` sets the first conv's stride to 1 (instead of 4) for inputs below 63 px.
    ``narrowing`` divides every layer's width (channels and hidden units) by that factor: the
    same layers and shapes at a fraction of the weights, for quick exactness checks.
    """

    def __init__(self, num_classes: int = 1000, in_channels: int = 3, dropout: float = 0.5,
                 small_stem: bool = False, narrowing: int = 1) -> None:
        super().__init__()
        c1, c2, c3, c4, hidden = (width // narrowing for width in (64, 192, 384, 256, 4096))
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, c1, 11, stride=1 if small_stem else 4, padding=2), nn.ReLU(),
            nn.MaxPool2d(3, 2),
            nn.Conv2d(c1, c2, 5, padding=2), nn.ReLU(),
            nn.MaxPool2d(3, 2),
            nn.Conv2d(c2, c3, 3, padding=1), nn.ReLU(),
            nn.Conv2d(c3, c4, 3, padding=1), nn.ReLU(),
            nn.Conv2d(c4, c4, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(3, 2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            nn.Dropout(dropout), nn.Linear(c4 * 6 * 6, hidden), nn.ReLU(),
            nn.Dropout(dropout), nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(self.avgpool(self.features(x)), 1)
        return self.classifier(x)


_VGG16_CFG: list[int | str] = [
    64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M",
]


class VGG(nn.Module):
    """VGG (Simonyan & Zisserman 2015) without batch norm; ``cfg`` lists widths and "M" pools."""

    def __init__(self, cfg: list[int | str], num_classes: int = 1000, in_channels: int = 3,
                 dropout: float = 0.5) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = in_channels
        for width in cfg:
            if width == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(channels, int(width), 3, padding=1), nn.ReLU()]
                channels = int(width)
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(4096, 4096), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(4096, num_classes),
        )
        for m in _initializable(self):
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(self.avgpool(self.features(x)), 1)
        return self.classifier(x)


# --------------------------------------------------------------------------------------------
# ResNet
# --------------------------------------------------------------------------------------------


def _conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


def _conv1x1(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers plus a shortcut, ``relu(out + identity)`` (He et al. 2016)."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1,
                 downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = _conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU()
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        out = out + identity
        return self.relu(out)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3, 1x1 expand (x4) plus a shortcut (He et al. 2016).

    The stride sits on the 3x3 conv (torchvision's "ResNet v1.5"), not on the first 1x1.
    """

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1,
                 downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = _conv1x1(inplanes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = _conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU()
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        out = out + identity
        return self.relu(out)


class ResNet(nn.Module):
    """Deep residual network (He et al. 2016), torchvision's module layout."""

    def __init__(self, block: type[BasicBlock] | type[Bottleneck], layers: list[int],
                 num_classes: int = 1000, in_channels: int = 3) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        inplanes = 64
        self.layer1, inplanes = self._make_layer(block, inplanes, 64, layers[0], 1)
        self.layer2, inplanes = self._make_layer(block, inplanes, 128, layers[1], 2)
        self.layer3, inplanes = self._make_layer(block, inplanes, 256, layers[2], 2)
        self.layer4, inplanes = self._make_layer(block, inplanes, 512, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(inplanes, num_classes)
        for m in _initializable(self):
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    @staticmethod
    def _make_layer(block: type[BasicBlock] | type[Bottleneck], inplanes: int, planes: int,
                    blocks: int, stride: int) -> tuple[nn.Sequential, int]:
        out = planes * block.expansion
        downsample = None
        if stride != 1 or inplanes != out:
            downsample = nn.Sequential(_conv1x1(inplanes, out, stride), nn.BatchNorm2d(out))
        layers = [block(inplanes, planes, stride, downsample)]
        layers += [block(out, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers), out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


# --------------------------------------------------------------------------------------------
# Inception-v3
# --------------------------------------------------------------------------------------------


class BasicConv2d(nn.Module):
    """Conv (no bias) + BatchNorm (eps 0.001) + ReLU, Inception-v3's unit (Szegedy et al. 2016)."""

    def __init__(self, in_channels: int, out_channels: int, **conv: Any) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, bias=False, **conv)
        self.bn = nn.BatchNorm2d(out_channels, eps=0.001)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


class InceptionA(nn.Module):
    """35x35 module: 1x1, 5x5, double 3x3 and pool branches (Szegedy et al. 2016, fig. 5)."""

    def __init__(self, in_channels: int, pool_features: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(in_channels, 64, kernel_size=1)
        self.branch5x5_1 = BasicConv2d(in_channels, 48, kernel_size=1)
        self.branch5x5_2 = BasicConv2d(48, 64, kernel_size=5, padding=2)
        self.branch3x3dbl_1 = BasicConv2d(in_channels, 64, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, kernel_size=3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, kernel_size=3, padding=1)
        self.branch_pool = BasicConv2d(in_channels, pool_features, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b1 = self.branch1x1(x)
        b5 = self.branch5x5_2(self.branch5x5_1(x))
        b3 = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        bp = self.branch_pool(F.avg_pool2d(x, kernel_size=3, stride=1, padding=1))
        outputs = [b1, b5, b3, bp]
        return torch.cat(outputs, 1)


class InceptionB(nn.Module):
    """Grid reduction 35x35 -> 17x17: strided 3x3, double 3x3 and max-pool (Szegedy et al. 2016)."""

    def __init__(self, in_channels: int) -> None:
        super().__init__()
        self.branch3x3 = BasicConv2d(in_channels, 384, kernel_size=3, stride=2)
        self.branch3x3dbl_1 = BasicConv2d(in_channels, 64, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, kernel_size=3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, kernel_size=3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b3 = self.branch3x3(x)
        bd = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        bp = F.max_pool2d(x, kernel_size=3, stride=2)
        outputs = [b3, bd, bp]
        return torch.cat(outputs, 1)


class InceptionC(nn.Module):
    """17x17 module with factorized 1x7 / 7x1 convolutions (Szegedy et al. 2016, fig. 6)."""

    def __init__(self, in_channels: int, channels_7x7: int) -> None:
        super().__init__()
        c7 = channels_7x7
        self.branch1x1 = BasicConv2d(in_channels, 192, kernel_size=1)
        self.branch7x7_1 = BasicConv2d(in_channels, c7, kernel_size=1)
        self.branch7x7_2 = BasicConv2d(c7, c7, kernel_size=(1, 7), padding=(0, 3))
        self.branch7x7_3 = BasicConv2d(c7, 192, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7dbl_1 = BasicConv2d(in_channels, c7, kernel_size=1)
        self.branch7x7dbl_2 = BasicConv2d(c7, c7, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7dbl_3 = BasicConv2d(c7, c7, kernel_size=(1, 7), padding=(0, 3))
        self.branch7x7dbl_4 = BasicConv2d(c7, c7, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7dbl_5 = BasicConv2d(c7, 192, kernel_size=(1, 7), padding=(0, 3))
        self.branch_pool = BasicConv2d(in_channels, 192, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b1 = self.branch1x1(x)
        b7 = self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x)))
        bd = self.branch7x7dbl_1(x)
        bd = self.branch7x7dbl_3(self.branch7x7dbl_2(bd))
        bd = self.branch7x7dbl_5(self.branch7x7dbl_4(bd))
        bp = self.branch_pool(F.avg_pool2d(x, kernel_size=3, stride=1, padding=1))
        outputs = [b1, b7, bd, bp]
        return torch.cat(outputs, 1)


class InceptionD(nn.Module):
    """Grid reduction 17x17 -> 8x8: 3x3 and 7x7x3 branches plus max-pool (Szegedy et al. 2016)."""

    def __init__(self, in_channels: int) -> None:
        super().__init__()
        self.branch3x3_1 = BasicConv2d(in_channels, 192, kernel_size=1)
        self.branch3x3_2 = BasicConv2d(192, 320, kernel_size=3, stride=2)
        self.branch7x7x3_1 = BasicConv2d(in_channels, 192, kernel_size=1)
        self.branch7x7x3_2 = BasicConv2d(192, 192, kernel_size=(1, 7), padding=(0, 3))
        self.branch7x7x3_3 = BasicConv2d(192, 192, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7x3_4 = BasicConv2d(192, 192, kernel_size=3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b3 = self.branch3x3_2(self.branch3x3_1(x))
        b7 = self.branch7x7x3_2(self.branch7x7x3_1(x))
        b7 = self.branch7x7x3_4(self.branch7x7x3_3(b7))
        bp = F.max_pool2d(x, kernel_size=3, stride=2)
        outputs = [b3, b7, bp]
        return torch.cat(outputs, 1)


class InceptionE(nn.Module):
    """8x8 module with expanded 1x3 / 3x1 filter banks (Szegedy et al. 2016, fig. 7)."""

    def __init__(self, in_channels: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(in_channels, 320, kernel_size=1)
        self.branch3x3_1 = BasicConv2d(in_channels, 384, kernel_size=1)
        self.branch3x3_2a = BasicConv2d(384, 384, kernel_size=(1, 3), padding=(0, 1))
        self.branch3x3_2b = BasicConv2d(384, 384, kernel_size=(3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = BasicConv2d(in_channels, 448, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(448, 384, kernel_size=3, padding=1)
        self.branch3x3dbl_3a = BasicConv2d(384, 384, kernel_size=(1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = BasicConv2d(384, 384, kernel_size=(3, 1), padding=(1, 0))
        self.branch_pool = BasicConv2d(in_channels, 192, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b1 = self.branch1x1(x)
        b3 = self.branch3x3_1(x)
        b3 = torch.cat([self.branch3x3_2a(b3), self.branch3x3_2b(b3)], 1)
        bd = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        bd = torch.cat([self.branch3x3dbl_3a(bd), self.branch3x3dbl_3b(bd)], 1)
        bp = self.branch_pool(F.avg_pool2d(x, kernel_size=3, stride=1, padding=1))
        outputs = [b1, b3, bd, bp]
        return torch.cat(outputs, 1)


class InceptionAux(nn.Module):
    """Auxiliary classifier on the 17x17 grid, used in training only (Szegedy et al. 2016)."""

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.conv0 = BasicConv2d(in_channels, 128, kernel_size=1)
        self.conv1 = BasicConv2d(128, 768, kernel_size=5)
        self.fc = nn.Linear(768, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.avg_pool2d(x, kernel_size=5, stride=3)
        x = self.conv1(self.conv0(x))
        x = torch.flatten(F.adaptive_avg_pool2d(x, (1, 1)), 1)
        return self.fc(x)


class Inception3(nn.Module):
    """Inception-v3 (Szegedy et al. 2016), torchvision's layout with ``transform_input=False``.

    ``small_stem`` sets the stride of Conv2d_1a_3x3, maxpool1 and maxpool2 to 1 (inputs below
    75 px). With ``aux_logits`` the forward returns ``(logits, aux)`` in training mode and only
    the logits in eval mode.
    """

    def __init__(self, num_classes: int = 1000, in_channels: int = 3, aux_logits: bool = False,
                 dropout: float = 0.5, small_stem: bool = False) -> None:
        super().__init__()
        s = 1 if small_stem else 2
        self.Conv2d_1a_3x3 = BasicConv2d(in_channels, 32, kernel_size=3, stride=s)
        self.Conv2d_2a_3x3 = BasicConv2d(32, 32, kernel_size=3)
        self.Conv2d_2b_3x3 = BasicConv2d(32, 64, kernel_size=3, padding=1)
        self.maxpool1 = nn.MaxPool2d(kernel_size=3, stride=s)
        self.Conv2d_3b_1x1 = BasicConv2d(64, 80, kernel_size=1)
        self.Conv2d_4a_3x3 = BasicConv2d(80, 192, kernel_size=3)
        self.maxpool2 = nn.MaxPool2d(kernel_size=3, stride=s)
        self.Mixed_5b = InceptionA(192, pool_features=32)
        self.Mixed_5c = InceptionA(256, pool_features=64)
        self.Mixed_5d = InceptionA(288, pool_features=64)
        self.Mixed_6a = InceptionB(288)
        self.Mixed_6b = InceptionC(768, channels_7x7=128)
        self.Mixed_6c = InceptionC(768, channels_7x7=160)
        self.Mixed_6d = InceptionC(768, channels_7x7=160)
        self.Mixed_6e = InceptionC(768, channels_7x7=192)
        self.AuxLogits = InceptionAux(768, num_classes) if aux_logits else None
        self.Mixed_7a = InceptionD(768)
        self.Mixed_7b = InceptionE(1280)
        self.Mixed_7c = InceptionE(2048)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.dropout = nn.Dropout(p=dropout)
        self.fc = nn.Linear(2048, num_classes)
        for m in _initializable(self):
            if isinstance(m, nn.Conv2d | nn.Linear):
                nn.init.trunc_normal_(m.weight, mean=0.0, std=0.1, a=-2, b=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        x = self.Conv2d_2b_3x3(self.Conv2d_2a_3x3(self.Conv2d_1a_3x3(x)))
        x = self.maxpool1(x)
        x = self.maxpool2(self.Conv2d_4a_3x3(self.Conv2d_3b_1x1(x)))
        x = self.Mixed_5d(self.Mixed_5c(self.Mixed_5b(x)))
        x = self.Mixed_6a(x)
        x = self.Mixed_6e(self.Mixed_6d(self.Mixed_6c(self.Mixed_6b(x))))
        aux = self.AuxLogits(x) if self.AuxLogits is not None and self.training else None
        x = self.Mixed_7c(self.Mixed_7b(self.Mixed_7a(x)))
        x = self.dropout(torch.flatten(self.avgpool(x), 1))
        x = self.fc(x)
        if aux is not None:
            return x, aux
        return x


# --------------------------------------------------------------------------------------------
# Factories
# --------------------------------------------------------------------------------------------


def tiny_cnn(num_classes: int = 10, image_size: int = 32, in_channels: int = 3) -> TinyCNN:
    """A small residual CNN for fast tests (any input of at least 3 px)."""
    _prepare("tiny_cnn", num_classes, image_size, in_channels)
    return TinyCNN(num_classes, in_channels)


def lenet5(num_classes: int = 10, image_size: int = 32, in_channels: int = 1) -> LeNet5:
    """LeNet-5 (LeCun et al. 1998), 61,706 parameters at 10 classes; inputs of at least 16 px."""
    _prepare("lenet5", num_classes, image_size, in_channels)
    return LeNet5(num_classes, in_channels)


def wide_fc(num_classes: int = 10, image_size: int = 32, in_channels: int = 1) -> WideFC:
    """Small convolutions and wide FC layers, 8,417,994 parameters at 10 classes; >= 4 px."""
    _prepare("wide_fc", num_classes, image_size, in_channels)
    return WideFC(num_classes, in_channels)


def cosmoflow2d(num_classes: int = 3, image_size: int = 256,
                in_channels: int = 1) -> CosmoFlow2D:
    """CosmoFlow's shape in 2D for high-resolution fields, 17,443 parameters at 3 classes;
    inputs of at least 8 px."""
    _prepare("cosmoflow2d", num_classes, image_size, in_channels)
    return CosmoFlow2D(num_classes, in_channels)


def alexnet(num_classes: int = 1000, image_size: int = 224, in_channels: int = 3) -> AlexNet:
    """AlexNet, torchvision layout (61,100,840 parameters at 1000 classes).

    Below 63 px the first conv gets stride 1 (small-input stem, same parameters); the minimum
    is then 21 px.
    """
    small = _prepare("alexnet", num_classes, image_size, in_channels)
    return AlexNet(num_classes, in_channels, small_stem=small)


def vgg16(num_classes: int = 1000, image_size: int = 224, in_channels: int = 3) -> VGG:
    """VGG-16, configuration D without batch norm (138,357,544 parameters); at least 32 px."""
    _prepare("vgg16", num_classes, image_size, in_channels)
    return VGG(_VGG16_CFG, num_classes, in_channels)


def _resnet(name: str, block: type[BasicBlock] | type[Bottleneck], layers: list[int],
            num_classes: int, image_size: int, in_channels: int) -> ResNet:
    _prepare(name, num_classes, image_size, in_channels)
    return ResNet(block, layers, num_classes, in_channels)


def resnet18(num_classes: int = 1000, image_size: int = 224, in_channels: int = 3) -> ResNet:
    """ResNet-18 (He et al. 2016): BasicBlock x [2, 2, 2, 2], 11,689,512 parameters."""
    return _resnet("resnet18", BasicBlock, [2, 2, 2, 2], num_classes, image_size, in_channels)


def resnet50(num_classes: int = 1000, image_size: int = 224, in_channels: int = 3) -> ResNet:
    """ResNet-50 (He et al. 2016): Bottleneck x [3, 4, 6, 3], 25,557,032 parameters."""
    return _resnet("resnet50", Bottleneck, [3, 4, 6, 3], num_classes, image_size, in_channels)


def resnet101(num_classes: int = 1000, image_size: int = 224, in_channels: int = 3) -> ResNet:
    """ResNet-101 (He et al. 2016): Bottleneck x [3, 4, 23, 3], 44,549,160 parameters."""
    return _resnet("resnet101", Bottleneck, [3, 4, 23, 3], num_classes, image_size, in_channels)


def resnet152(num_classes: int = 1000, image_size: int = 224, in_channels: int = 3) -> ResNet:
    """ResNet-152 (He et al. 2016): Bottleneck x [3, 8, 36, 3], 60,192,808 parameters."""
    return _resnet("resnet152", Bottleneck, [3, 8, 36, 3], num_classes, image_size, in_channels)


def inception_v3(num_classes: int = 1000, image_size: int = 299, in_channels: int = 3,
                 aux_logits: bool = False) -> Inception3:
    """Inception-v3 (Szegedy et al. 2016): 23,834,568 parameters, 27,161,264 with aux_logits.

    Below 75 px Conv2d_1a_3x3, maxpool1 and maxpool2 get stride 1 (small-input stem, same
    parameters); the minimum is then 17 px. The auxiliary head needs a 17x17 Mixed_6e map:
    at least 299 px with the standard stem (45 px with the small one).
    """
    small = _prepare("inception_v3", num_classes, image_size, in_channels, aux=aux_logits)
    return Inception3(num_classes, in_channels, aux_logits=aux_logits, small_stem=small)


_FACTORIES: dict[str, Callable[..., nn.Module]] = {
    "tiny_cnn": tiny_cnn,
    "lenet5": lenet5,
    "wide_fc": wide_fc,
    "cosmoflow2d": cosmoflow2d,
    "alexnet": alexnet,
    "vgg16": vgg16,
    "resnet18": resnet18,
    "resnet50": resnet50,
    "resnet101": resnet101,
    "resnet152": resnet152,
    "inception_v3": inception_v3,
    "cosmoflow3d": cosmoflow3d,
    "unet3d": unet3d,
    "unet3d_seg": unet3d_seg,
    "m5": m5,
}

_DESCRIPTIONS: dict[str, tuple[str, int, int, int]] = {  # description, C, H=W, classes
    "tiny_cnn": ("Tiny residual CNN for fast tests (layerwise)", 3, 32, 10),
    "lenet5": ("LeNet-5 (LeCun et al. 1998), ReLU and max-pooling", 1, 32, 10),
    "wide_fc": ("Small convolutions, wide FC layers: OWT's shape (layerwise)", 1, 32, 10),
    "cosmoflow2d": ("CosmoFlow's shape in 2D (Mathuriya et al. 2018): high-resolution fields",
                    1, 256, 3),
    "alexnet": ("AlexNet (Krizhevsky 2014 / 2012), torchvision layout", 3, 224, 1000),
    "vgg16": ("VGG-16 (Simonyan & Zisserman 2015), configuration D, torchvision layout",
              3, 224, 1000),
    "resnet18": ("ResNet-18 (He et al. 2016), torchvision layout", 3, 224, 1000),
    "resnet50": ("ResNet-50 (He et al. 2016), torchvision layout (v1.5)", 3, 224, 1000),
    "resnet101": ("ResNet-101 (He et al. 2016), torchvision layout (v1.5)", 3, 224, 1000),
    "resnet152": ("ResNet-152 (He et al. 2016), torchvision layout (v1.5)", 3, 224, 1000),
    "inception_v3": ("Inception-v3 (Szegedy et al. 2016), torchvision layout", 3, 299, 1000),
}

# the 1-d and 3-d networks (zoo_nd.py): description, C, side of each spatial dim, classes,
# spatial dims, smallest side
_ND_DESCRIPTIONS: dict[str, tuple[str, int, int, int, int, int]] = {
    "cosmoflow3d": ("CosmoFlow (Mathuriya et al. 2018): 3-d convolutions over volumes",
                    1, 32, 3, 3, 8),
    "unet3d": ("3-d U-Net (Cicek et al. 2016), MONAI's block layout, pooled to class scores",
               1, 32, 3, 3, 4),
    "unet3d_seg": ("3-d U-Net (Cicek et al. 2016) scoring every voxel: segmentation",
                   1, 32, 3, 3, 4),
    "m5": ("M5 (Dai et al. 2017): 1-d convolutions over raw signals", 1, 4096, 10, 1, 1024),
}

ZOO: dict[str, ModelSpec] = {
    **{name: ModelSpec(
        name=name, description=desc, in_channels=c, image_size=size, num_classes=k,
        min_standard_size=_min_input(_paths(name, small=False)),
    ) for name, (desc, c, size, k) in _DESCRIPTIONS.items()},
    **{name: ModelSpec(
        name=name, description=desc, in_channels=c, image_size=size, num_classes=k,
        spatial_dims=dims, min_standard_size=least,
    ) for name, (desc, c, size, k, dims, least) in _ND_DESCRIPTIONS.items()},
}


# --------------------------------------------------------------------------------------------
# build_model and user models
# --------------------------------------------------------------------------------------------


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _resolve_reference(ref: str) -> Callable[..., Any]:
    module_name, _, attr = (part.strip() for part in ref.partition(":"))
    if not module_name or not attr:
        raise UnknownModelError(
            f"model reference {ref!r} is malformed: write it as package.module:factory"
        )
    importlib.invalidate_caches()
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise UnknownModelError(
            f"cannot import module {module_name!r} of model {ref!r} ({_one_line(exc)}): "
            "check the name, install the package or add its folder to PYTHONPATH"
        ) from exc
    except SystemExit as exc:  # sys.exit in a module is its author's, not ours to obey
        raise UnknownModelError(
            f"importing module {module_name!r} of model {ref!r} called sys.exit({exc.code!r}); "
            "a module that defines a model must not exit"
        ) from None
    except Exception as exc:
        raise UnknownModelError(
            f"importing module {module_name!r} of model {ref!r} failed with "
            f"{type(exc).__name__}: {_one_line(exc)}; fix that module"
        ) from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UnknownModelError(
                f"module {module_name!r} has no attribute {attr!r} (model {ref!r}): check the "
                "factory name after the colon"
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise UnknownModelError(
            f"{ref!r} is a {type(obj).__name__}, not callable: point it at a function or class "
            "that returns a torch.nn.Module"
        )
    return obj


_KEYWORD_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
# a factory's TypeError for an argument it does not take, as Python words it
_UNEXPECTED_ARGUMENT = re.compile(r"got an unexpected keyword argument '(\w+)'")


def _keyword_names(callable_: Callable[..., Any]) -> set[str] | None:
    """The keyword arguments `callable_` names; None when it takes any (**kwargs) or its
    signature cannot be read."""
    try:
        params = inspect.signature(callable_).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind in _KEYWORD_KINDS}


def _returned_class(factory: Callable[..., Any]) -> type | None:
    """The module class a function's return annotation names (torchvision's builders are
    annotated `-> ResNet`), or None."""
    try:
        returned = typing.get_type_hints(factory).get("return")
    except Exception:  # an annotation that does not resolve says nothing
        return None
    return returned if isinstance(returned, type) and issubclass(returned, nn.Module) else None


def _accepted_kwargs(factory: Callable[..., Any], offered: dict[str, int]) -> dict[str, int]:
    """The subset of ``offered`` that ``factory`` takes by keyword: the names its signature
    has; for a factory that forwards **kwargs (torchvision's builders), the names of the
    class it is annotated to return, or all of them when neither says."""
    try:
        inspect.signature(factory)
    except (TypeError, ValueError):  # no introspectable signature: pass nothing
        return {}
    names = _keyword_names(factory)
    if names is None and not isinstance(factory, type):
        returned = _returned_class(factory)
        names = None if returned is None else _keyword_names(returned)
    return dict(offered) if names is None else {k: v for k, v in offered.items() if k in names}


def _call_factory(factory: Callable[..., Any], kwargs: dict[str, Any],
                  device: str | torch.device | None, given: dict[str, Any], name: str) -> Any:
    """``factory(**kwargs)`` on `device`. An offered argument it refuses ("unexpected keyword
    argument", from a **kwargs it hands on) is dropped and the call made again, as if it had
    not been offered: the input size still reaches the model as the traced input's, and a
    model that takes no num_classes keeps its own (training checks its output); one `given`
    in the reference is the user's word, and its refusal is theirs to fix. An
    initialisation that cannot run on the meta device (one that reads values back from a
    tensor) runs on the CPU, and the model then moves to meta."""
    kwargs = dict(kwargs)
    while True:
        try:
            with _on_device(device):
                return factory(**kwargs)
        except TypeError as exc:
            refused = _UNEXPECTED_ARGUMENT.search(str(exc))
            if refused is not None and refused.group(1) in given:
                raise UnknownModelError(
                    f"model factory {name!r} takes no argument {refused.group(1)!r}: check the "
                    "arguments after its name") from None
            if refused is None or refused.group(1) not in kwargs:
                raise
            del kwargs[refused.group(1)]
        except (NotImplementedError, RuntimeError) as exc:
            if device is None or torch.device(device).type != "meta" or "meta" not in str(exc):
                raise
            model = factory(**kwargs)
            return model.to(device) if isinstance(model, nn.Module) else model


def _initializable(model: nn.Module) -> Iterator[nn.Module]:
    """Submodules whose weights hold values; meta weights (planning only) are skipped, since
    initialising them computes nothing and costs seconds of one-time kernel setup."""
    return (m for m in model.modules() if not getattr(m, "weight", torch.empty(0)).is_meta)


def _on_device(device: str | torch.device | None) -> contextlib.AbstractContextManager[Any]:
    return contextlib.nullcontext() if device is None else torch.device(device)


def build_model(name: str, num_classes: int | None = None, image_size: InputSize | None = None,
                in_channels: int | None = None,
                device: str | torch.device | None = None) -> nn.Module:
    """Build a zoo model by name, or a user model given as ``package.module:factory``, with
    the factory's own keyword arguments if the reference names them (`split_reference`).

    Arguments left as None take the zoo spec's defaults; a user factory gets only those of
    ``num_classes``, ``image_size`` and ``in_channels`` that are set, that it takes
    (`_accepted_kwargs`; torchvision's ``resnet18(**kwargs)`` gets ``num_classes``, never
    ``image_size``) and that its reference does not set itself. ``device`` (e.g. "meta") is
    where the parameters are created; "meta" plans a large model without allocating memory.
    Raises UnknownModelError with a one-line reason.
    """
    _check_positive(num_classes=num_classes, image_size=image_size, in_channels=in_channels)
    if isinstance(name, str) and ":" in name:
        reference, given = split_reference(name)
        factory = _resolve_reference(reference)
        if isinstance(image_size, tuple):  # a square image as its side, as --image-size gives
            image_size = compact_size(image_size)
        offered = {k: v for k, v in (("num_classes", num_classes), ("image_size", image_size),
                                     ("in_channels", in_channels))
                   if v is not None and k not in given}
        kwargs = {**_accepted_kwargs(factory, offered), **given}
        try:
            model = _call_factory(factory, kwargs, device, given, name)
        except LayerwiseError:
            raise
        except SystemExit as exc:
            raise UnknownModelError(
                f"model factory {name!r} called sys.exit({exc.code!r}); a factory must return "
                "the network"
            ) from None
        except Exception as exc:
            raise UnknownModelError(
                f"model factory {name!r} raised {type(exc).__name__}: {_one_line(exc)}; fix "
                "the factory"
            ) from exc
        if not isinstance(model, nn.Module):
            raise UnknownModelError(
                f"model factory {name!r} returned a {type(model).__name__}, not a "
                "torch.nn.Module: make it return the network"
            )
        return model
    spec = _spec_for(name)
    sizes = _zoo_sizes(spec, image_size)
    with _on_device(device):
        return _FACTORIES[spec.name](
            num_classes=spec.num_classes if num_classes is None else num_classes,
            image_size=sizes[0] if spec.spatial_dims == 2 else sizes,
            in_channels=spec.in_channels if in_channels is None else in_channels,
        )


def _zoo_sizes(spec: ModelSpec, image_size: InputSize | None) -> tuple[int, ...]:
    """A zoo model's spatial sizes: its default side, or the given side or sizes; 2-d zoo
    models take square images, and every model its own number of spatial dims."""
    sizes = spatial_size(spec.image_size if image_size is None else image_size,
                         spec.spatial_dims)
    if len(sizes) != spec.spatial_dims:
        raise UnknownModelError(
            f"{spec.name} takes {_INPUT_KINDS[spec.spatial_dims]}, not an input of "
            f"{len(sizes)} spatial size(s) {sizes}: give --input-shape with "
            f"{spec.spatial_dims} spatial size(s), or --image-size N")
    if spec.spatial_dims == 2 and sizes[0] != sizes[1]:
        raise UnknownModelError(f"{spec.name} takes square images, not {sizes[0]}x{sizes[1]}: "
                                "use --image-size N")
    return sizes


_INPUT_KINDS = {1: "(N, C, L) signals", 2: "(N, C, H, W) images",
                3: "(N, C, D, H, W) volumes"}


def input_shape(name_or_spec: str | ModelSpec, batch: int, image_size: InputSize | None = None,
                in_channels: int | None = None) -> tuple[int, ...]:
    """(batch, C, *spatial) of a model's input, with the spec's defaults for what is None: a
    side for every spatial dim of the model (`image_size` an int), or each dim's size.

    A user reference (``package.module:factory``) defaults to 3 channels at 224x224; an int
    `image_size` gives it a square image.
    """
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise LayerwiseError(f"batch must be a positive integer, got {batch!r}")
    _check_positive(image_size=image_size, in_channels=in_channels)
    if isinstance(name_or_spec, str) and ":" in name_or_spec:
        c = USER_DEFAULT_CHANNELS
        sizes = spatial_size(USER_DEFAULT_IMAGE_SIZE if image_size is None else image_size, 2)
    else:
        spec = _spec_for(name_or_spec)
        c, sizes = spec.in_channels, _zoo_sizes(spec, image_size)
    c = c if in_channels is None else in_channels
    return (batch, c, *sizes)


class ModelSummary(pydantic.BaseModel):
    """One zoo entry as `layerwise models` lists it."""

    model_config = pydantic.ConfigDict(frozen=True)

    name: str
    description: str
    parameters: int
    conv_layers: int
    fc_layers: int
    input_shape: tuple[int, ...]  # (C, *spatial)
    num_classes: int


# every convolution a zoo model may hold, transposed ones too (unet3d's upsampling)
_CONVOLUTIONS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
                 nn.ConvTranspose3d)


def summarize_zoo() -> list[ModelSummary]:
    """Every zoo model at its defaults, built on the meta device (no weights allocated)."""
    summaries = []
    for spec in ZOO.values():
        model = build_model(spec.name, device="meta")
        modules = list(model.modules())
        summaries.append(ModelSummary(
            name=spec.name, description=spec.description,
            parameters=sum(p.numel() for p in model.parameters()),
            conv_layers=sum(isinstance(m, _CONVOLUTIONS) for m in modules),
            fc_layers=sum(isinstance(m, nn.Linear) for m in modules),
            input_shape=input_shape(spec, 1)[1:],
            num_classes=spec.num_classes,
        ))
    return summaries
