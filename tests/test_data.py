"""Data preparation: the digits split, and `dvc repro prepare` in a temporary git repo."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from strategies.errors import LayerwiseError
from tasks.data import load_params, main, prepare_digits, split_indices
from tests.dvc_repo import data_repo, run

ROOT = Path(__file__).resolve().parents[1]


def test_digits_are_resized_split_per_class_and_normalised(tmp_path):
    meta = prepare_digits(tmp_path, image_size=16, val_fraction=0.25, seed=3)
    train, val = np.load(tmp_path / "train.npz"), np.load(tmp_path / "val.npz")
    assert train["x"].shape == (meta["train"], 1, 16, 16) and train["x"].dtype == np.float32
    assert meta["train"] + meta["val"] == 1797
    assert abs(float(train["x"].mean())) < 1e-4 and abs(float(train["x"].std()) - 1) < 1e-3
    train_counts = np.bincount(train["y"], minlength=10)
    val_counts = np.bincount(val["y"], minlength=10)
    shares = val_counts / (train_counts + val_counts)
    assert np.all(np.abs(shares - 0.25) < 0.02)  # every class keeps its share
    assert json.loads((tmp_path / "meta.json").read_text())["seed"] == 3


def test_the_split_is_deterministic_and_disjoint():
    labels = np.repeat(np.arange(10), 37)
    first = split_indices(labels, 0.2, seed=7)
    again = split_indices(labels, 0.2, seed=7)
    other = split_indices(labels, 0.2, seed=8)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not np.array_equal(first[1], other[1])
    assert not set(first[0]) & set(first[1])
    assert len(first[0]) + len(first[1]) == len(labels)
    with pytest.raises(LayerwiseError, match="between 0 and 1"):
        split_indices(labels, 1.5, seed=0)


def test_bad_params_are_one_clear_line(tmp_path, capsys):
    bad = tmp_path / "params.yaml"
    bad.write_text("prepare:\n  image_size: 8\n  colour: blue\n")
    with pytest.raises(LayerwiseError, match="prepare.colour: unknown parameter"):
        load_params(bad)
    bad.write_text("prepare: [unclosed\n")
    assert main(["--params", str(bad)]) == 2
    assert capsys.readouterr().out.startswith("error:")
    assert main(["--params", str(tmp_path / "missing.yaml")]) == 2


def test_dvc_repro_prepare_builds_tracks_and_skips_unchanged_data(tmp_path):
    dvc = str(Path(sys.executable).parent / "dvc")
    repo = data_repo(tmp_path)
    first = run([dvc, "repro", "prepare"], repo)
    assert "prepared digits" in first.stdout
    meta = json.loads((repo / "data/prepared/digits/meta.json").read_text())
    assert meta["image_size"] == 8
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    assert lock["stages"]["prepare"]["params"]["params.yaml"]["prepare"]["image_size"] == 8
    unchanged = run([dvc, "repro", "prepare"], repo)
    assert "didn't change" in unchanged.stdout
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["prepare"]["image_size"] = 12
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    run([dvc, "repro", "prepare"], repo)
    assert json.loads((repo / "data/prepared/digits/meta.json").read_text())["image_size"] == 12
