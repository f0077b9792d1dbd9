"""The per-layer figure of a strategy run: which dims each layer splits, how far, on which devices.

A bare Figure (no pyplot): no global figure state, no GUI backend on a headless machine.
"""

from __future__ import annotations

import numpy as np
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from layerwise.strategies.model.space import DIMS, ParallelConfig, view_dims
from layerwise.strategies.training_run import RunResult

SPLIT_WORDS = {"n": "samples", "c": "channels", "d": "depth", "h": "height", "w": "width",
               "l": "length"}


def degrees_figure(result: RunResult) -> Figure:
    """Where the strategy splits what, per layer: a heat map of log2 of each dim's degree
    (n, c and the model's spatial dims: l; h, w; or d, h, w; the degree written in each cell,
    blank where it is 1), and below it the block of devices each layer runs on (of the run's
    processes)."""
    names = [choice.name for choice in result.strategy.layers]
    configs = [ParallelConfig.parse(choice.config) for choice in result.strategy.layers]
    devices = max([result.nproc, *(max(config.devices) + 1 for config in configs)])
    rank = len(result.strategy.input_shape)
    rows = view_dims(rank)
    labels = [("l" if rank == 3 and DIMS[row] == "w" else DIMS[row]) for row in rows]
    exponents = np.log2(np.array([[config.degrees[row] for row in rows] for config in configs],
                                 dtype=float).T)
    top = max(1, int(exponents.max()))
    figure = Figure(figsize=(max(6.0, 0.5 * len(names) + 2.0), 2.4 + 0.25 * (4 + devices)),
                    layout="constrained")
    heat_axes, device_axes = figure.subplots(
        2, 1, sharex=True, height_ratios=[4, max(1, min(devices, 8))])
    colors = ListedColormap(["#f4f4f4", *[_shade(level / top) for level in range(1, top + 1)]])
    image = heat_axes.imshow(exponents, aspect="auto", cmap=colors,
                             norm=BoundaryNorm(np.arange(-0.5, top + 1), top + 1))
    for (row, column), exponent in np.ndenumerate(exponents):
        if exponent > 0:
            heat_axes.text(column, row, str(2 ** int(exponent)), ha="center", va="center",
                           fontsize=8, color="white" if exponent > top / 2 else "black")
    heat_axes.set_yticks(range(len(rows)), [f"{dim} ({SPLIT_WORDS[dim]})" for dim in labels])
    heat_axes.set_title(f"{result.model} under '{result.strategy.name}': how far each layer "
                        "splits each dim")
    bar = figure.colorbar(image, ax=heat_axes, ticks=range(top + 1), pad=0.01)
    bar.ax.set_yticklabels([str(2 ** level) for level in range(top + 1)])
    bar.set_label("degree")
    for column, config in enumerate(configs):
        for device in config.devices:
            device_axes.add_patch(_device_cell(column, device))
    device_axes.set_ylim(devices - 0.5, -0.5)
    device_axes.set_yticks(range(devices))
    device_axes.set_ylabel("device")
    device_axes.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=7)
    device_axes.set_xlim(-0.5, len(names) - 0.5)
    return figure


def _shade(share: float) -> tuple[float, float, float]:
    """From light to dark blue as the degree grows."""
    light, dark = np.array([0.74, 0.84, 0.93]), np.array([0.03, 0.19, 0.42])
    return tuple(light + (dark - light) * share)


def _device_cell(column: int, device: int) -> Rectangle:
    return Rectangle((column - 0.45, device - 0.45), 0.9, 0.9, color="#4a7ab5")
