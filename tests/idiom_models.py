"""Small CNNs written the way users write them, for tests/test_idioms.py (and three of AlexNet's,
Inception-v3's and ResNet-18's shapes, narrow, for tests/test_verify.py).

The torchrun workers build them by reference (`tests.idiom_models:idioms`), so they live in an
importable module rather than in the test file; each takes `num_classes` as zoo factories do.
"""

from __future__ import annotations

from collections import namedtuple

import torch
import torch.nn.functional as F
from torch import nn

from layerwise.strategies.model.zoo import AlexNet, BasicBlock, BasicConv2d


class SamePadding(nn.Module):
    """padding="same" and "valid" given as strings."""

    def __init__(self, num_classes: int = 4) -> None:
        super().__init__()
        self.same = nn.Conv2d(3, 6, 3, padding="same")
        self.dilated = nn.Conv2d(6, 6, 3, padding="same", dilation=2)
        self.valid = nn.Conv2d(6, 6, 3, padding="valid")
        self.fc = nn.Linear(6 * 6 * 6, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.valid(self.dilated(self.same(x))), 1))


class ViewFlatten(nn.Module):
    """The flatten most models in the wild write: x.view(x.size(0), -1)."""

    def __init__(self, num_classes: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 8 * 8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv(x))
        return self.fc(x.view(x.size(0), -1))


class ReshapeFlatten(ViewFlatten):
    """x.reshape(x.shape[0], -1), reading the batch from .shape."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv(x))
        return self.fc(x.reshape(x.shape[0], -1))


class MeanPool(nn.Module):
    """Global average pooling written as a mean over h and w, with and without keepdim."""

    def __init__(self, num_classes: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        kept = x.mean(dim=[2, 3], keepdim=True)
        return self.fc(x.mean((2, 3)) + torch.flatten(kept, 1))


class GroupNormNet(nn.Module):
    """GroupNorm after a conv, and GroupNorm(1, C), the usual LayerNorm of a conv net."""

    def __init__(self, num_classes: int = 4) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.norm1 = nn.GroupNorm(2, 8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.norm2 = nn.GroupNorm(1, 8)
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.norm1(self.conv1(x)))
        x = F.relu(self.norm2(self.conv2(x)))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class GroupNormSplits(nn.Module):
    """GroupNorm as SegResNet and detection heads use it, a module and the function, to split
    along every dim: the tiles of one plane sum each group's statistics."""

    def __init__(self, num_classes: int = 4) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.norm1 = nn.GroupNorm(4, 8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.norm1(self.conv1(x)))
        x = F.relu(F.group_norm(self.conv2(x), 2))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class LayerNormNet(nn.Module):
    """LayerNorm over each sample's (C, H, W) after a conv and over the features after a linear
    layer."""

    def __init__(self, num_classes: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.norm = nn.LayerNorm([4, 8, 8])
        self.hidden = nn.Linear(4 * 8 * 8, 16)
        self.hidden_norm = nn.LayerNorm(16)
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.norm(self.conv(x)))
        return self.fc(F.relu(self.hidden_norm(self.hidden(torch.flatten(x, 1)))))


class PaddingModes(nn.Module):
    """Convolutions padded by reflection, replication and wrapping around; a reflection by 2
    around a 3x3 kernel grows the plane to 10 rows, which at most 2 tiles split (a border
    tile of 10 // 4 rows reads 2 rows, not more than the 2 its padding mirrors)."""

    def __init__(self, num_classes: int = 4) -> None:
        super().__init__()
        self.reflect = nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect")
        self.wide = nn.Conv2d(4, 4, 3, padding=2, padding_mode="reflect")
        self.replicate = nn.Conv2d(4, 4, 3, padding=1, padding_mode="replicate")
        self.circular = nn.Conv2d(4, 4, 3, padding=1, padding_mode="circular")
        self.fc = nn.Linear(4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.circular(self.replicate(self.wide(F.relu(self.reflect(x)))))
        return self.fc(x.mean((2, 3)))


class ChannelsLastNorm(nn.Module):
    """LayerNorm over the channels as ConvNeXt writes it (permute to channels-last, normalise,
    permute back): a module fused into its conv, and a function on a layer of its own (its
    input also feeds a residual add)."""

    def __init__(self, num_classes: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.LayerNorm(8)
        self.mix = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.conv(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        x = self.mix(F.relu(x))
        x = x + F.layer_norm(x.permute(0, 2, 3, 1), (8,)).permute(0, 3, 1, 2)
        return self.fc(x.mean((2, 3)))


class ChannelsLastPool(nn.Module):
    """A permute into channels-last with no way back: the mean then runs over positions of
    the channels-last tensor, which no layer of the (N, C, H, W) tensor is."""

    def __init__(self, num_classes: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.pointwise = nn.Linear(8, 8)
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pointwise(self.conv(x).permute(0, 2, 3, 1)).mean((1, 2)))


class ChannelsLastMlp(nn.Module):
    """A channels-last run outside any residual block (ConvNeXt's inverted bottleneck without
    its shortcut): one tensor crosses after each of its ops, but the model holds those
    channels-last, so no block of local parallelism may end there."""

    def __init__(self, num_classes: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.LayerNorm(8)
        self.expand = nn.Linear(8, 16)
        self.project = nn.Linear(16, 8)
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x).permute(0, 2, 3, 1)
        x = self.project(F.gelu(self.expand(self.norm(x)))).permute(0, 3, 1, 2)
        return self.fc(F.relu(x).mean((2, 3)))


class SharedScale(nn.Module):
    """One parameter read by two ops: shared between two layers."""

    def __init__(self, num_classes: int = 4) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.scale = nn.Parameter(torch.ones(8, 1, 1))
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv2(self.conv1(x) * self.scale) * self.scale
        return self.fc(x.mean((2, 3)))


def stochastic_depth(x: torch.Tensor, p: float, mode: str, training: bool) -> torch.Tensor:
    """Stochastic depth as torchvision writes it (a function fx keeps whole): in training,
    each sample's residual branch is dropped with probability p ("row" mode), or the whole
    batch's ("batch")."""
    if not training or p == 0.0:
        return x
    size = [x.shape[0]] + [1] * (x.ndim - 1) if mode == "row" else [1] * x.ndim
    noise = torch.empty(size, dtype=x.dtype, device=x.device).bernoulli_(1.0 - p)
    return x * noise.div_(1.0 - p)


torch.fx.wrap("stochastic_depth")


class StochasticDepth(nn.Module):
    """torchvision's StochasticDepth module: its p and mode, handed to the function."""

    def __init__(self, p: float, mode: str) -> None:
        super().__init__()
        self.p, self.mode = p, mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return stochastic_depth(x, self.p, self.mode, self.training)


class MixedView(nn.Module):
    """A view that moves values between channels and rows (pixel-shuffle-like, written by
    hand): not a channel map."""

    def __init__(self, num_classes: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        n, c, h, w = x.size()
        x = x.view(n, c // 2, h * 2, w)
        return self.fc(x.mean((2, 3)))


class SharedConv(nn.Module):
    """One conv called twice: its weights are shared between two layers."""

    def __init__(self, num_classes: int = 4) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.shared = nn.Conv2d(4, 4, 3, padding=1)
        self.fc = nn.Linear(4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.shared(F.relu(self.shared(self.stem(x))))
        return self.fc(x.mean((2, 3)))


class Idioms(nn.Module):
    """Every supported idiom above in one network, so one torchrun launch trains them all;
    layers held to fewer dims sit next to layers split along h and w."""

    def __init__(self, num_classes: int = 4) -> None:
        super().__init__()
        self.same = nn.Conv2d(3, 12, 3, padding="same")
        self.norm = nn.GroupNorm(6, 12)
        self.dilated = nn.Conv2d(12, 8, 3, padding="same", dilation=2)
        self.reflect = nn.Conv2d(8, 8, 3, padding=1, padding_mode="reflect")
        self.wide = nn.Conv2d(8, 8, 3, padding=2, padding_mode="reflect")
        self.replicate = nn.Conv2d(8, 8, 3, padding=1, padding_mode="replicate")
        self.channel_norm = nn.LayerNorm(8)
        self.circular = nn.Conv2d(8, 8, 3, padding=1, padding_mode="circular")
        self.plain = nn.Conv2d(8, 8, 3, padding=1)
        self.sample_norm = nn.LayerNorm([8, 10, 10])
        self.valid = nn.Conv2d(8, 8, 3, padding="valid")
        self.layer_norm = nn.GroupNorm(1, 8)
        self.head_norm = nn.LayerNorm(8)
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # GroupNorms split along n and c into whole groups (6 groups of 2 channels: at most
        # 2 tiles; 4 of 2: at most 4), reflect and replicate padding along any dim (the wide
        # one into at most 2 tiles per axis), LayerNorm over the channels along n, h and w,
        # circular padding held to n, c
        x = F.group_norm(self.dilated(F.relu(self.norm(self.same(x)))), 4)
        x = self.replicate(self.wide(self.reflect(x)))
        x = self.channel_norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        x = self.circular(x)
        x = F.relu(self.layer_norm(self.valid(self.sample_norm(self.plain(x)))))
        x = x + F.layer_norm(x.permute(0, 2, 3, 1), (8,)).permute(0, 3, 1, 2)
        pooled = x.mean((2, 3)) + x.mean(dim=[2, 3], keepdim=True).view(x.size(0), -1)
        pooled = pooled + F.adaptive_avg_pool2d(x, 1).reshape(x.shape[0], -1)
        return self.fc(self.head_norm(pooled))


class Activations(nn.Module):
    """Activations of model libraries no list in layerwise names, taken by their elementwise
    nature: modules (Hardsigmoid, Mish, SELU, Softplus, CELU) and functions (F.hardswish,
    F.mish), each fused after a convolution that splits along every dim; with the volumes
    model's leaky ReLU and average pool (cosmoflow2d's float64 verify is `make verify-zoo`'s);
    and the gates of MobileNetV3's, EfficientNet's and RegNetY's blocks: a squeeze-and-excitation
    scale [N, C, 1, 1] (pool to one pixel, a 1x1 conv down, ReLU, a 1x1 conv up, sigmoid) times
    the feature map, a spatial gate [N, 1, H, W] (a one-channel conv, sigmoid) times it, and the
    scale added back, each broadcast along the dims where it has size 1."""

    def __init__(self, num_classes: int = 4, in_channels: int = 3) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 8, 3, padding=1)
        self.gate = nn.Hardsigmoid()
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.mish = nn.Mish()
        self.conv3 = nn.Conv2d(8, 8, 3, padding=1)
        self.selu = nn.SELU()
        self.softplus = nn.Softplus(beta=2.0)
        self.conv4 = nn.Conv2d(8, 8, 3, padding=1)
        self.celu = nn.CELU(0.5)
        self.squeeze = nn.Conv2d(8, 2, 1)
        self.excite = nn.Conv2d(2, 8, 1)
        self.spatial = nn.Conv2d(8, 1, 3, padding=1)
        self.pool = nn.AvgPool2d(2)
        self.leaky = nn.LeakyReLU(0.01)
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.gate(self.conv1(x))
        scale = torch.sigmoid(self.excite(F.relu(self.squeeze(F.adaptive_avg_pool2d(x, 1)))))
        x = scale * x
        x = x * torch.sigmoid(self.spatial(x)) + scale
        x = self.pool(F.hardswish(self.mish(self.conv2(x))))
        x = self.softplus(self.selu(self.conv3(x)))
        x = self.leaky(F.mish(self.celu(self.conv4(x))))
        return self.fc(x.mean((2, 3)))


class ChannelSoftmax(nn.Module):
    """Softmax2d: a softmax over the channels at each position, not elementwise."""

    def __init__(self, num_classes: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.softmax = nn.Softmax2d()
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.softmax(self.conv(x)).mean((2, 3)))


class RandomSlopes(ChannelSoftmax):
    """RReLU: a random negative slope per element in training."""

    def __init__(self, num_classes: int = 4) -> None:
        super().__init__(num_classes)
        self.softmax = nn.RReLU()


# GoogLeNet's and Inception-v3's way of returning main and auxiliary scores while training
AuxiliaryOutputs = namedtuple("AuxiliaryOutputs", ["logits", "aux_logits"])


class AuxiliaryScores(nn.Module):
    """Main and auxiliary class scores in a named tuple while training, the main alone in
    evaluation."""

    def __init__(self, num_classes: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.aux = nn.Linear(8, num_classes)
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor | AuxiliaryOutputs:
        x = F.relu(self.conv(x)).mean((2, 3))
        if self.training:
            return AuxiliaryOutputs(self.fc(x), self.aux(x))
        return self.fc(x)


class TwoScores(AuxiliaryScores):
    """The same scores as a plain tuple."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = F.relu(self.conv(x)).mean((2, 3))
        return self.fc(x), self.aux(x)


class EvenSame(nn.Module):
    """padding="same" with an even kernel: torch pads one side more than the other."""

    def __init__(self, num_classes: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 2, padding="same")
        self.fc = nn.Linear(4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x).mean((2, 3)))



class ScoreMaps(nn.Module):
    """A fully convolutional net: per-pixel scores (N, classes, H, W), no classifier."""

    def __init__(self, num_classes: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, num_classes, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def narrow_alexnet(num_classes: int = 10, in_channels: int = 3) -> AlexNet:
    """The zoo's AlexNet at a sixteenth of its width, for tests/test_verify.py: its large
    strided stem with padding, overlapping max-pools (3, stride 2), an adaptive average pool
    that repeats its input, dropout before the wide layers. Its float64 runs take seconds where
    AlexNet's 58M weights take minutes (AlexNet itself: `make verify-zoo`)."""
    return AlexNet(num_classes, in_channels, narrowing=16)


class NarrowInception(nn.Module):
    """Inception-v3's kinds of module at a tiny width, for tests/test_verify.py: four branches
    concatenated (1x1, 1x1 then 5x5, double 3x3, average pool then 1x1), a grid reduction
    concatenating strided convolutions with a max-pool, factorized 1x7 / 7x1 convolutions, and
    concatenations nested in the last concatenation (1x3 beside 3x1), all of BasicConv2d
    (conv, BatchNorm eps 0.001, ReLU), then dropout and the classifier. Inception-v3 itself
    runs at 2 processes in `make verify-zoo`."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3) -> None:
        super().__init__()
        self.stem = BasicConv2d(in_channels, 8, kernel_size=3, padding=1)
        self.mixed_a = nn.ModuleDict({
            "b1": BasicConv2d(8, 4, kernel_size=1),
            "b5_1": BasicConv2d(8, 4, kernel_size=1),
            "b5_2": BasicConv2d(4, 4, kernel_size=5, padding=2),
            "b3_1": BasicConv2d(8, 4, kernel_size=1),
            "b3_2": BasicConv2d(4, 6, kernel_size=3, padding=1),
            "b3_3": BasicConv2d(6, 6, kernel_size=3, padding=1),
            "pool": BasicConv2d(8, 2, kernel_size=1)})
        self.reduce_b3 = BasicConv2d(16, 8, kernel_size=3, stride=2)
        self.reduce_bd = BasicConv2d(16, 6, kernel_size=3, stride=2)
        self.mixed_c = nn.ModuleDict({
            "b1": BasicConv2d(30, 6, kernel_size=1),
            "b7_1": BasicConv2d(30, 4, kernel_size=1),
            "b7_2": BasicConv2d(4, 4, kernel_size=(1, 7), padding=(0, 3)),
            "b7_3": BasicConv2d(4, 6, kernel_size=(7, 1), padding=(3, 0))})
        self.mixed_e = nn.ModuleDict({
            "b3_1": BasicConv2d(12, 6, kernel_size=1),
            "b3_2a": BasicConv2d(6, 4, kernel_size=(1, 3), padding=(0, 1)),
            "b3_2b": BasicConv2d(6, 4, kernel_size=(3, 1), padding=(1, 0)),
            "pool": BasicConv2d(12, 4, kernel_size=1)})
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.dropout = nn.Dropout(0.5)
        self.fc = nn.Linear(12, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        a = self.mixed_a
        x = torch.cat([a["b1"](x), a["b5_2"](a["b5_1"](x)),
                       a["b3_3"](a["b3_2"](a["b3_1"](x))),
                       a["pool"](F.avg_pool2d(x, kernel_size=3, stride=1, padding=1))], 1)
        x = torch.cat([self.reduce_b3(x), self.reduce_bd(x),
                       F.max_pool2d(x, kernel_size=3, stride=2)], 1)
        c = self.mixed_c
        x = torch.cat([c["b1"](x), c["b7_3"](c["b7_2"](c["b7_1"](x)))], 1)
        e = self.mixed_e
        b3 = e["b3_1"](x)
        x = torch.cat([torch.cat([e["b3_2a"](b3), e["b3_2b"](b3)], 1),
                       e["pool"](F.avg_pool2d(x, kernel_size=3, stride=1, padding=1))], 1)
        x = self.dropout(torch.flatten(self.avgpool(x), 1))
        return self.fc(x)


class NarrowResNet(nn.Module):
    """ResNet-18's kinds of layer at an eighth of its width, for tests/test_verify.py: the
    strided 7x7 stem, a padded max-pool, a residual block, and a strided block whose shortcut
    is a strided 1x1 convolution with its own BatchNorm (ResNet-18 itself: `make
    verify-zoo`)."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 8, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        shortcut = nn.Sequential(nn.Conv2d(8, 16, 1, stride=2, bias=False), nn.BatchNorm2d(16))
        self.layer1 = BasicBlock(8, 8)
        self.layer2 = BasicBlock(8, 16, stride=2, downsample=shortcut)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class DarknetBlocks(nn.Module):
    """Darknet's convolution, BatchNorm and leaky ReLU blocks (YOLO's backbone): each block's
    BatchNorm and leaky ReLU save their inputs for the backward, two tensors the size of the
    block's output, which recomputing a block frees from the forward on."""

    def __init__(self, num_classes: int = 4, in_channels: int = 3, width: int = 8,
                 blocks: int = 4) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = in_channels
        for _ in range(blocks):
            layers += [nn.Conv2d(channels, width, 3, padding=1, bias=False),
                       nn.BatchNorm2d(width), nn.LeakyReLU(0.1)]
            channels = width
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x).mean((2, 3)))


class TinyUNet(nn.Module):
    """An encoder-decoder written as MONAI's BasicUNet writes its blocks (not its code): two
    conv-InstanceNorm-LeakyReLU per block, max pooling down, a stride-2 ConvTranspose2d up,
    the skip concatenated with the upsampled map, then a 1x1 head; pooled to class scores,
    as a training run needs one (batch, classes) tensor. Two levels (the deeper transposed
    conv halving the channels), and a third ConvTranspose2d with an odd kernel, padding and
    output padding."""

    def __init__(self, num_classes: int = 4, in_channels: int = 3) -> None:
        super().__init__()

        def block(inputs: int, outputs: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(inputs, outputs, 3, padding=1), nn.InstanceNorm2d(outputs, affine=True),
                nn.LeakyReLU(0.1),
                nn.Conv2d(outputs, outputs, 3, padding=1), nn.InstanceNorm2d(outputs),
                nn.LeakyReLU(0.1))

        self.down0 = block(in_channels, 8)
        self.down1 = block(8, 16)
        self.bottom = block(16, 16)
        self.up1 = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.merge1 = block(24, 8)
        self.up0 = nn.ConvTranspose2d(8, 8, 2, stride=2)
        self.merge0 = block(16, 8)
        self.refine = nn.ConvTranspose2d(8, 8, 3, stride=2, padding=1, output_padding=1)
        self.head = nn.Conv2d(8, num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip0 = self.down0(x)
        skip1 = self.down1(F.max_pool2d(skip0, 2))
        bottom = self.bottom(F.max_pool2d(skip1, 2))
        x = self.merge1(torch.cat([skip1, self.up1(bottom)], dim=1))
        x = self.merge0(torch.cat([skip0, self.up0(x)], dim=1))
        x = F.max_pool2d(self.refine(x), 2)
        return self.head(x).mean((2, 3))


class Upsampling(nn.Module):
    """A decoder upsampling as model libraries write it (MONAI's and segmentation heads'
    "nontrainable" upsampling): nn.Upsample by a scale factor (nearest; bilinear with and
    without align_corners) and F.interpolate to another tensor's size or by a fractional
    factor, with convolutions and a skip concatenation between them; pooled to class scores."""

    def __init__(self, num_classes: int = 4, in_channels: int = 3) -> None:
        super().__init__()
        self.stem = nn.Conv2d(in_channels, 8, 3, stride=2, padding=1)
        self.nearest = nn.Upsample(scale_factor=2, mode="nearest")
        self.smooth = nn.Conv2d(8, 8, 3, padding=1)
        self.cornered = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
        self.fuse = nn.Conv2d(16, 8, 3, padding=1)
        self.bilinear = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up = F.relu(self.smooth(self.nearest(F.relu(self.stem(x)))))
        down = F.max_pool2d(up, 2)
        sized = F.interpolate(down, size=up.shape[2:], mode="bilinear", align_corners=False)
        x = F.relu(self.fuse(torch.cat([self.cornered(down), sized], dim=1)))
        x = F.interpolate(self.bilinear(x), scale_factor=1.5, mode="nearest")
        return self.fc(x.mean((2, 3)))


class Volume(nn.Module):
    """A 3-d network with each 3-d layer kind, written as MONAI's and torchvision's video
    models write theirs: an anisotropic strided stem with BatchNorm3d, ceil-mode max pooling, a
    dilated grouped convolution with an anisotropic kernel, InstanceNorm3d, Dropout3d, average
    pooling without the padding in its divisor, a transposed convolution and a trilinear
    upsampling of one map concatenated, and adaptive max pooling to class scores."""

    def __init__(self, num_classes: int = 4, in_channels: int = 1) -> None:
        super().__init__()
        self.stem = nn.Conv3d(in_channels, 8, 3, stride=(1, 2, 2), padding=1)
        self.bn = nn.BatchNorm3d(8)
        self.pool = nn.MaxPool3d(3, stride=2, padding=1, ceil_mode=True)
        self.dilated = nn.Conv3d(8, 8, (3, 1, 3), padding=(2, 0, 2), dilation=2, groups=2)
        self.norm = nn.InstanceNorm3d(8, affine=True)
        self.drop = nn.Dropout3d(0.2)
        self.avg = nn.AvgPool3d(2, stride=1, padding=1, count_include_pad=False)
        self.up = nn.ConvTranspose3d(8, 8, 2, stride=2)
        self.upsample = nn.Upsample(scale_factor=2, mode="trilinear", align_corners=False)
        self.fuse = nn.Conv3d(16, 8, 1)
        self.head = nn.AdaptiveMaxPool3d((1, 2, 2))
        self.fc = nn.Linear(8 * 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.bn(self.stem(x))))
        y = self.avg(self.drop(F.leaky_relu(self.norm(self.dilated(x)), 0.1)))
        z = F.relu(self.fuse(torch.cat([self.up(y), self.upsample(y)], dim=1)))
        return self.fc(torch.flatten(self.head(z), 1))


class Signal(nn.Module):
    """A 1-d network with each 1-d layer kind, written as audio models (torchaudio's
    wav2letter, M5) write theirs: a wide strided stem with BatchNorm1d, max pooling, a dilated
    grouped convolution, InstanceNorm1d, Dropout1d, average pooling without the padding in its
    divisor, a transposed convolution and a linear interpolation with aligned corners
    concatenated, a reflect-padded convolution, adaptive average pooling to class scores."""

    def __init__(self, num_classes: int = 4, in_channels: int = 2) -> None:
        super().__init__()
        self.stem = nn.Conv1d(in_channels, 8, 9, stride=2, padding=4)
        self.bn = nn.BatchNorm1d(8)
        self.pool = nn.MaxPool1d(3, stride=2, padding=1)
        self.grouped = nn.Conv1d(8, 8, 3, padding=2, dilation=2, groups=4)
        self.norm = nn.InstanceNorm1d(8, affine=True)
        self.drop = nn.Dropout1d(0.2)
        self.avg = nn.AvgPool1d(3, stride=1, padding=1, count_include_pad=False)
        self.up = nn.ConvTranspose1d(8, 8, 4, stride=2, padding=1)
        self.reflect = nn.Conv1d(16, 8, 5, padding=2, padding_mode="reflect")
        self.head = nn.AdaptiveAvgPool1d(3)
        self.fc = nn.Linear(8 * 3, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.bn(self.stem(x))))
        y = self.avg(self.drop(F.gelu(self.norm(self.grouped(x)))))
        up = F.interpolate(y, scale_factor=2, mode="linear", align_corners=True)
        z = F.relu(self.reflect(torch.cat([self.up(y), up], dim=1)))
        return self.fc(torch.flatten(self.head(z), 1))


class _ResidualUnit(nn.Module):
    """MONAI's ResidualUnit as its docs describe it (not its code): `subunits` convolutions,
    each followed by InstanceNorm, Dropout and PReLU (its "NDA" order), the first strided; the
    residual is a strided 3x3 convolution where the size changes, a 1x1 one where only the
    channels do, the input itself otherwise; their sum is the unit's output."""

    def __init__(self, dims: int, inputs: int, outputs: int, stride: int, subunits: int,
                 slopes: int = 1) -> None:
        super().__init__()
        conv = (nn.Conv1d, nn.Conv2d, nn.Conv3d)[dims - 1]
        norm = (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)[dims - 1]
        units: list[nn.Module] = []
        channels = inputs
        for index in range(subunits):
            units += [conv(channels, outputs, 3, stride=stride if index == 0 else 1, padding=1),
                      norm(outputs), nn.Dropout(0.1), nn.PReLU(slopes)]
            channels = outputs
        self.conv = nn.Sequential(*units)
        if stride != 1:
            self.residual: nn.Module = conv(inputs, outputs, 3, stride=stride, padding=1)
        elif inputs != outputs:
            self.residual = conv(inputs, outputs, 1)
        else:
            self.residual = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x) + self.residual(x)


class MonaiUNet(nn.Module):
    """MONAI's UNet as its docs describe it, at two levels: residual units down (stride 2),
    a transposed convolution (kernel 3, stride 2, padding 1, output padding 1, as MONAI pads
    it) with InstanceNorm and PReLU up, the skip concatenated before a one-subunit residual
    unit, PReLU with one shared slope as MONAI's default act, one per channel in the bottom;
    the voxel scores as MONAI returns them (`dense`), or averaged into class scores."""

    def __init__(self, dims: int = 2, num_classes: int = 4, in_channels: int = 1,
                 dense: bool = False) -> None:
        super().__init__()
        self.dense = dense
        transposed = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)[dims - 1]
        norm = (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)[dims - 1]
        self.dims = dims
        self.down0 = _ResidualUnit(dims, in_channels, 4, 2, 2)
        self.down1 = _ResidualUnit(dims, 4, 8, 2, 2)
        self.bottom = _ResidualUnit(dims, 8, 8, 1, 2, slopes=8)
        self.up1 = nn.Sequential(transposed(16, 4, 3, stride=2, padding=1, output_padding=1),
                                 norm(4), nn.PReLU())
        self.merge1 = _ResidualUnit(dims, 4, 4, 1, 1)
        self.up0 = nn.Sequential(transposed(8, num_classes, 3, stride=2, padding=1,
                                            output_padding=1), norm(num_classes), nn.PReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip0 = self.down0(x)
        skip1 = self.down1(skip0)
        x = self.merge1(self.up1(torch.cat([skip1, self.bottom(skip1)], dim=1)))
        x = self.up0(torch.cat([skip0, x], dim=1))
        return x if self.dense else x.mean(tuple(range(2, 2 + self.dims)))


def monai_unet3d(num_classes: int = 4, in_channels: int = 1) -> MonaiUNet:
    return MonaiUNet(3, num_classes, in_channels)


def monai_unet_scores(num_classes: int = 4, in_channels: int = 1) -> MonaiUNet:
    """The 2-d UNet scoring every pixel, as MONAI's segmentation networks end."""
    return MonaiUNet(2, num_classes, in_channels, dense=True)


class CoarseScores(nn.Module):
    """An encoder without its decoder: scores at half the input's resolution."""

    def __init__(self, num_classes: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, num_classes, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    """ShuffleNet's channel shuffle, its sizes read off the tensor: a 5-d view of the groups,
    the group and channel dims swapped, and the view back."""
    batch, channels, height, width = x.size()
    x = x.view(batch, groups, channels // groups, height, width)
    x = torch.transpose(x, 1, 2).contiguous()
    return x.view(batch, channels, height, width)


class _ShuffleUnit(nn.Module):
    """ShuffleNetV2's unit: at stride 1 half the channels pass through (`chunk`) and half go
    through the branch; at stride 2 both halves are branches of the whole input; the halves
    concatenated, then shuffled."""

    def __init__(self, channels_in: int, channels_out: int, stride: int) -> None:
        super().__init__()
        half = channels_out // 2
        self.stride = stride
        if stride > 1:
            self.branch1 = nn.Sequential(
                nn.Conv2d(channels_in, channels_in, 3, stride, 1, groups=channels_in,
                          bias=False),
                nn.BatchNorm2d(channels_in),
                nn.Conv2d(channels_in, half, 1, bias=False), nn.BatchNorm2d(half),
                nn.ReLU(inplace=True))
        else:
            self.branch1 = nn.Sequential()
        self.branch2 = nn.Sequential(
            nn.Conv2d(channels_in if stride > 1 else half, half, 1, bias=False),
            nn.BatchNorm2d(half), nn.ReLU(inplace=True),
            nn.Conv2d(half, half, 3, stride, 1, groups=half, bias=False), nn.BatchNorm2d(half),
            nn.Conv2d(half, half, 1, bias=False), nn.BatchNorm2d(half), nn.ReLU(inplace=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat((x1, self.branch2(x2)), dim=1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)
        return channel_shuffle(out, 2)


class ShuffleUnits(nn.Module):
    """ShuffleNetV2 as torchvision writes it, narrow: a stem, a stride-2 unit and a stride-1
    unit (chunk, concatenation, channel shuffle), a 1x1 conv, the mean over h and w, a
    classifier; and a slice of the channels (`x[:, :4]`) beside them."""

    def __init__(self, num_classes: int = 4, in_channels: int = 3) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, 8, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(8), nn.ReLU(inplace=True))
        self.stages = nn.Sequential(_ShuffleUnit(8, 16, 2), _ShuffleUnit(16, 16, 1))
        self.conv5 = nn.Sequential(nn.Conv2d(16, 16, 1, bias=False), nn.BatchNorm2d(16),
                                   nn.ReLU(inplace=True))
        self.fc = nn.Linear(16 + 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv5(self.stages(self.stem(x)))
        return self.fc(torch.cat((x.mean([2, 3]), x[:, :4].mean([2, 3])), dim=1))


class LayerNorm2d(nn.LayerNorm):
    """ConvNeXt's LayerNorm over the channels of an (N, C, H, W) tensor: a LayerNorm subclass
    that permutes in its own forward and hands its weight and bias to F.layer_norm."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class _ScaledBlock(nn.Module):
    """A residual block whose branch is scaled per channel by a parameter of its own, used
    directly (`self.layer_scale * branch`), as ConvNeXt's and CaiT's layer scale is."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.depthwise = nn.Conv2d(channels, channels, 7, padding=3, groups=channels)
        self.norm = LayerNorm2d(channels, eps=1e-6)
        self.expand = nn.Conv2d(channels, 4 * channels, 1)
        self.act = nn.GELU()
        self.project = nn.Conv2d(4 * channels, channels, 1)
        self.layer_scale = nn.Parameter(torch.full((channels, 1, 1), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branch = self.project(self.act(self.expand(self.norm(self.depthwise(x)))))
        result = self.layer_scale * branch
        return result + x


class LayerScale(nn.Module):
    """A ConvNeXt-like network written channels-first: a patchify stem with LayerNorm2d,
    layer-scaled residual blocks, a LayerNorm2d and a strided conv between stages, and the
    head's LayerNorm2d before a classifier; plus a bias parameter added directly with a value
    per position along w (held whole along w)."""

    def __init__(self, num_classes: int = 4, in_channels: int = 3) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, 8, 2, stride=2), LayerNorm2d(8))
        self.stage1 = _ScaledBlock(8)
        self.down = nn.Sequential(LayerNorm2d(8), nn.Conv2d(8, 16, 2, stride=2))
        self.stage2 = _ScaledBlock(16)
        self.position_bias = nn.Parameter(torch.linspace(-1.0, 1.0, 4))
        self.head_norm = LayerNorm2d(16)
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stage2(self.down(self.stage1(self.stem(x))))
        x = x + self.position_bias
        return self.fc(torch.flatten(self.head_norm(F.adaptive_avg_pool2d(x, 1)), 1))


class Permute(nn.Module):
    """torchvision's Permute module: torch.permute with the dims it was built with."""

    def __init__(self, dims: list[int]) -> None:
        super().__init__()
        self.dims = dims

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.permute(x, self.dims)


class _ConvNeXtBlock(nn.Module):
    """ConvNeXt's block as torchvision writes it: a 7x7 depthwise conv, then on the
    channels-last tensor LayerNorm, Linear(C, 4C), GELU, Linear(4C, C), back to
    channels-first, scaled per channel by a parameter used directly, dropped per sample by
    stochastic depth (p = 0 in the first block), added to the input."""

    def __init__(self, channels: int, drop: float = 0.0) -> None:
        super().__init__()
        self.block = nn.Sequential(
            nn.Conv2d(channels, channels, 7, padding=3, groups=channels),
            Permute([0, 2, 3, 1]), nn.LayerNorm(channels, eps=1e-6),
            nn.Linear(channels, 4 * channels), nn.GELU(), nn.Linear(4 * channels, channels),
            Permute([0, 3, 1, 2]))
        self.layer_scale = nn.Parameter(torch.full((channels, 1, 1), 0.5))
        self.stochastic_depth = StochasticDepth(drop, "row")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = self.layer_scale * self.block(x)
        result = self.stochastic_depth(result)
        result += x
        return result


class ConvNeXtBlocks(nn.Module):
    """ConvNeXt as torchvision writes it, narrow: a patchify stem with LayerNorm2d, two
    stages of blocks with a LayerNorm2d and a strided conv between them, and a head of
    average pooling, LayerNorm2d, flatten and Linear."""

    def __init__(self, num_classes: int = 4, in_channels: int = 3) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Sequential(nn.Conv2d(in_channels, 8, 2, stride=2), LayerNorm2d(8, eps=1e-6)),
            nn.Sequential(_ConvNeXtBlock(8)),
            nn.Sequential(LayerNorm2d(8, eps=1e-6), nn.Conv2d(8, 16, 2, stride=2)),
            nn.Sequential(_ConvNeXtBlock(16, drop=0.5)))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(LayerNorm2d(16, eps=1e-6), nn.Flatten(1),
                                        nn.Linear(16, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.avgpool(self.features(x)))


class LibraryBlocks(nn.Module):
    """The blocks above in one network, so one torchrun launch trains them all: ShuffleNetV2's
    units (chunk, concatenation, channel shuffle), ConvNeXt's block (Linear layers on the
    channels-last tensor, a layer scale, stochastic depth), LayerNorm2d, and a bias per column
    used directly."""

    def __init__(self, num_classes: int = 4, in_channels: int = 3) -> None:
        super().__init__()
        self.stem = nn.Conv2d(in_channels, 8, 3, padding=1)
        self.units = nn.Sequential(_ShuffleUnit(8, 16, 2), _ShuffleUnit(16, 16, 1))
        self.block = _ConvNeXtBlock(16, drop=0.5)
        self.norm = LayerNorm2d(16)
        self.column_bias = nn.Parameter(torch.linspace(-1.0, 1.0, 4))
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.block(self.units(self.stem(x)))) + self.column_bias
        return self.fc(x.mean((2, 3)))


class SizedDecoder(nn.Module):
    """An encoder-decoder whose decoder pads its upsampled map to its skip's size by reading
    sizes in Python, as MONAI's UpCat does: `len(x.shape)` and a comparison per spatial dim
    (odd sides get a replicated row, even ones nothing), then the skip concatenated and a 1x1
    head scoring every pixel."""

    def __init__(self, num_classes: int = 3, in_channels: int = 1) -> None:
        super().__init__()
        self.encode = nn.Sequential(nn.Conv2d(in_channels, 4, 3, padding=1), nn.ReLU())
        self.down = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(4, 8, 3, padding=1), nn.ReLU())
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.head = nn.Conv2d(8, num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = self.encode(x)
        up = self.up(self.down(skip))
        dimensions = len(up.shape) - 2
        pads = [0] * (2 * dimensions)
        for index in range(dimensions):
            if skip.shape[-index - 1] != up.shape[-index - 1]:
                pads[2 * index + 1] = 1
        up = F.pad(up, pads, "replicate")
        return self.head(torch.cat([skip, up], dim=1))


class BatchSizedView(nn.Module):
    """Reads sizes in Python (`len(x.shape)`) and views by the batch it traced with: a graph
    traced with sizes known would hold that batch as a constant."""

    def __init__(self, num_classes: int = 3) -> None:
        super().__init__()
        self.fc = nn.Linear(3 * 8 * 8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(x.shape[0] if len(x.shape) == 4 else 1, -1)
        return self.fc(flat)


class Paddings(nn.Module):
    """Every way users pad: F.pad replicate of the bottom and right rows (MONAI's UpCat at odd
    sides), nn.ReflectionPad2d before a valid convolution, nn.ZeroPad2d, a constant F.pad of
    one side, a circular pad and a crop (a negative pad)."""

    def __init__(self, num_classes: int = 4, in_channels: int = 3) -> None:
        super().__init__()
        self.reflect = nn.ReflectionPad2d((1, 2, 2, 1))
        self.conv = nn.Conv2d(in_channels, 6, 3)
        self.zero = nn.ZeroPad2d(1)
        self.head = nn.Conv2d(6, num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.pad(x, [0, 1, 0, 1], "replicate")
        x = torch.relu(self.conv(self.reflect(x)))
        x = F.pad(self.zero(x), [2, 0], "constant", 0.5)
        x = F.pad(x, [1, 1, 1, 1], "circular")
        x = F.pad(x, [-1, -2, -2, -1])
        return self.head(x).mean((2, 3))
