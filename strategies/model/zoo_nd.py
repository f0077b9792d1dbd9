"""The zoo's 1-d and 3-d networks: a volume classifier, a volumetric encoder-decoder and a raw
signal classifier, the workloads where one sample fills a device and only splits along depth,
height and width (or length) spread it.

Each is written from its paper's description (the layer sizes and kinds below), in the way
model libraries write such networks; `zoo.py` registers them with their default input shapes.
They end in one (batch, classes) tensor of class scores, but for the U-Net's segmentation form
(`unet3d_seg`), which scores every voxel (batch, classes, D, H, W) against a label per voxel.
"""

from __future__ import annotations

import torch
from torch import nn

from layerwise.strategies.errors import UnknownModelError

_LEAK = 0.01  # leaky ReLUs' negative slope, as in CosmoFlow


def _check_sizes(name: str, sizes: tuple[int, ...], dims: int, least: int) -> None:
    """One line when `sizes` is not `dims` spatial sizes of at least `least` each."""
    if len(sizes) != dims or min(sizes) < least:
        kind = "(N, C, L) signals" if dims == 1 else "(N, C, D, H, W) volumes"
        raise UnknownModelError(f"{name} takes {kind} of at least {least} along each spatial "
                                f"dim, got {sizes}: give --input-shape with larger sizes")


class CosmoFlow3D(nn.Module):
    """CosmoFlow (Mathuriya et al., SC'18) in the shape the paper gives: 3-d convolutions with
    leaky ReLUs and no normalisation, each stage but the last halving the volume by average
    pooling while the channels widen, then fully connected layers to the outputs (the paper
    regresses three cosmological parameters from 128^3 dark-matter volumes; here they are
    class scores, and the widths are scaled down by `width`). A global pool before the fully
    connected layers keeps them independent of the volume's size.

    One 128^3 sample's first activation is 8 MB per channel against kilobytes of weights: past
    a sample per device only depth, height and width splits spread it.
    """

    def __init__(self, num_classes: int = 3, in_channels: int = 1, width: int = 8) -> None:
        super().__init__()
        self.features, self.avgpool, self.classifier = field_classifier(
            3, in_channels, (width, 2 * width, 4 * width, 8 * width), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def field_classifier(dims: int, in_channels: int, widths: tuple[int, ...], num_classes: int
                     ) -> tuple[nn.Sequential, nn.Module, nn.Sequential]:
    """CosmoFlow's layers in `dims` dimensions: convolution stages of `widths` channels with
    leaky ReLUs, an average pool halving the field between stages, a global pool, two fully
    connected layers; He initialisation for the leaky ReLUs, zero biases."""
    conv = (nn.Conv1d, nn.Conv2d, nn.Conv3d)[dims - 1]
    pool = (nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d)[dims - 1]
    layers: list[nn.Module] = []
    for index, (cin, cout) in enumerate(zip((in_channels, *widths[:-1]), widths, strict=True)):
        layers += [conv(cin, cout, 3, padding=1), nn.LeakyReLU(_LEAK)]
        if index < len(widths) - 1:
            layers.append(pool(2))
    features = nn.Sequential(*layers)
    average = (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d)[dims - 1](1)
    classifier = nn.Sequential(nn.Linear(widths[-1], 64), nn.LeakyReLU(_LEAK),
                               nn.Linear(64, num_classes))
    for module in (*features, *classifier):
        if isinstance(module, conv | nn.Linear):
            nn.init.kaiming_normal_(module.weight, a=_LEAK, nonlinearity="leaky_relu")
            nn.init.zeros_(module.bias)
    return features, average, classifier


class UNet3D(nn.Module):
    """A 3-d U-Net (Cicek et al., MICCAI 2016) at two levels: per level two 3x3x3
    convolution-InstanceNorm-LeakyReLU blocks (as MONAI's BasicUNet writes its blocks), max
    pooling down, a stride-2 transposed convolution up, the encoder's map concatenated to the
    decoder's (the skip), then a 1x1x1 head scoring every voxel: as the paper segments
    (`dense`), or averaged into one score per class of the volume."""

    def __init__(self, num_classes: int = 3, in_channels: int = 1, width: int = 8,
                 dense: bool = False) -> None:
        super().__init__()
        self.dense = dense

        def block(inputs: int, outputs: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv3d(inputs, outputs, 3, padding=1),
                nn.InstanceNorm3d(outputs, affine=True), nn.LeakyReLU(0.1),
                nn.Conv3d(outputs, outputs, 3, padding=1),
                nn.InstanceNorm3d(outputs, affine=True), nn.LeakyReLU(0.1))

        self.down0 = block(in_channels, width)
        self.pool0 = nn.MaxPool3d(2)
        self.down1 = block(width, 2 * width)
        self.pool1 = nn.MaxPool3d(2)
        self.bottom = block(2 * width, 4 * width)
        self.up1 = nn.ConvTranspose3d(4 * width, 2 * width, 2, stride=2)
        self.merge1 = block(4 * width, 2 * width)
        self.up0 = nn.ConvTranspose3d(2 * width, width, 2, stride=2)
        self.merge0 = block(2 * width, width)
        self.head = nn.Conv3d(width, num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip0 = self.down0(x)
        skip1 = self.down1(self.pool0(skip0))
        bottom = self.bottom(self.pool1(skip1))
        x = self.merge1(torch.cat([skip1, self.up1(bottom)], dim=1))
        x = self.merge0(torch.cat([skip0, self.up0(x)], dim=1))
        scores = self.head(x)
        return scores if self.dense else scores.mean((2, 3, 4))


class M5(nn.Module):
    """M5 (Dai et al., ICASSP 2017, "Very deep convolutional neural networks for raw
    waveforms"): a wide first convolution (80 taps, stride 4) over the raw signal, then 3-tap
    convolutions, each followed by BatchNorm, ReLU and a 4-fold max pool, a global average pool
    over time and one fully connected layer; 128, 128, 256, 512 channels in the paper, scaled
    by `width` / 128 here."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, width: int = 32) -> None:
        super().__init__()
        widths = (width, width, 2 * width, 4 * width)
        layers: list[nn.Module] = []
        for index, (cin, cout) in enumerate(zip((in_channels, *widths[:-1]), widths,
                                                strict=True)):
            kernel, stride = (80, 4) if index == 0 else (3, 1)
            layers += [nn.Conv1d(cin, cout, kernel, stride=stride, padding=kernel // 2 - 1
                                 if index == 0 else 1),
                       nn.BatchNorm1d(cout), nn.ReLU(inplace=True), nn.MaxPool1d(4)]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(widths[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).mean(-1))


def cosmoflow3d(num_classes: int = 3, image_size: tuple[int, ...] = (32, 32, 32),
                in_channels: int = 1) -> CosmoFlow3D:
    """CosmoFlow's 3-d shape on volumes of at least 8 per side (three halvings)."""
    _check_sizes("cosmoflow3d", tuple(image_size), 3, 8)
    return CosmoFlow3D(num_classes, in_channels)


def unet3d(num_classes: int = 3, image_size: tuple[int, ...] = (32, 32, 32),
           in_channels: int = 1) -> UNet3D:
    """A two-level 3-d U-Net on volumes whose sides are multiples of 4 (two halvings that the
    transposed convolutions double back)."""
    _check_sizes("unet3d", tuple(image_size), 3, 4)
    if any(size % 4 for size in image_size):
        raise UnknownModelError(f"unet3d's two poolings and upsamplings give back its input "
                                f"only for sides that are multiples of 4, got {image_size}")
    return UNet3D(num_classes, in_channels)


def unet3d_seg(num_classes: int = 3, image_size: tuple[int, ...] = (32, 32, 32),
               in_channels: int = 1) -> UNet3D:
    """unet3d scoring every voxel, to train on a label per voxel (the segments dataset)."""
    unet3d(num_classes, image_size, in_channels)  # its checks of the input's sides
    return UNet3D(num_classes, in_channels, dense=True)


def m5(num_classes: int = 10, image_size: tuple[int, ...] = (4096,),
       in_channels: int = 1) -> M5:
    """M5 on signals of at least 1024 samples (a stride of 4 and four 4-fold pools)."""
    _check_sizes("m5", tuple(image_size), 1, 1024)
    return M5(num_classes, in_channels)
