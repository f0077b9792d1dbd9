"""Padding of the spatial dims as users write it (F.pad in every mode, nn.ZeroPad2d,
nn.ReflectionPad2d, a crop by a negative pad) is a layer of its own, split along every dim: each
output row copies the input row torch's pad copies, and a tile reads the input rows its rows
copy. Proven against torch's own pad, then in float64 on 4 processes with the predicted bytes;
padding the channels is refused in one line."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

import layerwise
from layerwise.flows.cli import app
from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.model.graph import build_graph, trace
from layerwise.strategies.model.padding import PAD_MODES, source_reach, source_rows
from layerwise.strategies.model.space import DIMS
from layerwise.strategies.model.tiles import needed_range
from tests.idiom_models import Paddings

runner = CliRunner()


@pytest.mark.parametrize("mode", PAD_MODES)
@pytest.mark.parametrize(("before", "after"), [(2, 1), (0, 3), (3, 0), (-1, 2)])
def test_each_output_row_copies_the_row_torch_pads_it_with(mode, before, after):
    """The rows of F.pad of 0..size-1 (its value -1 where a constant pad writes), and the
    reach of every tile of rows: the least and greatest row it copies."""
    size = 5
    padded = F.pad(torch.arange(size, dtype=torch.float64).view(1, 1, size), [before, after],
                   mode=mode, **({"value": -1.0} if mode == "constant" else {}))[0, 0]
    rows = source_rows(mode, before, after, size, 0, size + before + after)
    assert rows.tolist() == padded.long().tolist()
    for start in range(len(rows)):
        for stop in range(start + 1, len(rows) + 1):
            first, last = source_reach(mode, before, after, size, start, stop)
            copied = rows[start:stop][rows[start:stop] >= 0]
            nearest = 0 if start < before else size - 1  # read and ignored
            assert (first, last) == ((copied.min(), copied.max() + 1) if copied.size
                                     else (nearest, nearest + 1))
            assert 0 <= first < last <= size


def test_every_padding_is_a_layer_whose_tiles_read_the_rows_they_copy():
    graph = build_graph("tests.idiom_models:Paddings", batch=2, image_size=9)
    pads = [layer for layer in graph.layers if layer.kind == "pad"]
    assert [layer.op for layer in pads] == ["pad(replicate)", "ReflectionPad2d", "ZeroPad2d",
                                            "pad(constant)", "pad(circular)", "pad(constant)"]
    assert graph.param_count == sum(p.numel() for p in Paddings().parameters())
    replicate, reflect = pads[0], pads[1]
    height = DIMS.index("h")
    assert needed_range(replicate, 0, height, (5, 10)) == (5, 9)  # the last row twice
    assert needed_range(reflect, 0, height, (0, 3)) == (0, 3)  # rows 2, 1 mirrored, then 0
    assert reflect.padding is not None and reflect.padding.sides == ((2, 1), (1, 2))


def test_paddings_split_along_height_and_width_train_equal_to_one_process(
        tmp_path, workers_import_tests):
    reference = "tests.idiom_models:Paddings"
    strategies = "data,spatial,spatial_h,spatial_w,model"
    result = runner.invoke(app, ["verify", reference, "--strategy", strategies, "--nproc", "4",
                                 "--image-size", "9", "--batch", "2", "--steps", "2",
                                 "--out", str(tmp_path / "v"), "--json"])
    assert result.exit_code == 0, result.output
    verdicts = {d["strategy"]: d["exact"] for d in json.loads(result.stdout)["divergences"]}
    assert verdicts == dict.fromkeys(strategies.split(","), True)
    run = layerwise.train(reference, "spatial", nproc=4, steps=1, out=tmp_path / "run",
                          image_size=9, batch=2)
    assert run.bytes_per_step == run.predicted_bytes_per_step
    assert run.bytes_per_step.transfer > 0


def test_padding_the_channels_is_refused_in_one_line():
    class ChannelPad(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.pad(x, [0, 0, 0, 0, 1, 1]).mean((2, 3))

    with pytest.raises(LayerwiseError, match=r"pad of the channels or the batch \(\[0, 0, 0, 0, "
                                             r"1, 1\]\): layerwise pads spatial dims only"):
        trace(ChannelPad(), (2, 3, 8, 8))
