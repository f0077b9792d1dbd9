"""Training data of `layerwise train`: the global batches, the synthetic task, the prepared
datasets (digits, CIFAR, image folders)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.model.zoo import build_model
from layerwise.strategies.runtime.datasets import GlobalBatches, ImageSpec, load_dataset
from layerwise.tasks.stages.prepare_data import prepare_cifar, prepare_digits, prepare_imagefolder
from tests.test_data import write_cifar, write_image_tree


def test_batches_depend_only_on_seed_and_step():
    """What a resumed run relies on: step k's batch is the same in any process, any time."""
    first = GlobalBatches(load_dataset("synthetic", 8, 10, 3, seed=5).train, 64, seed=5)
    again = GlobalBatches(load_dataset("synthetic", 8, 10, 3, seed=5).train, 64, seed=5)
    for step in (1, 7, first.steps_per_epoch + 3):
        x, y = first.batch_at(step)
        x_again, y_again = again.batch_at(step)
        assert np.array_equal(x, x_again) and np.array_equal(y, y_again)
    other_x, _ = GlobalBatches(first.split, 64, seed=6).batch_at(1)
    assert not np.array_equal(first.batch_at(1)[0], other_x)


def test_an_epoch_visits_each_sample_once_and_drops_the_partial_batch():
    data = load_dataset("synthetic", 8, 10, 3, seed=0).train
    batches = GlobalBatches(data, 100, seed=0)
    assert batches.steps_per_epoch == len(data) // 100
    epoch = np.concatenate([batches.indices_at(step)
                            for step in range(1, batches.steps_per_epoch + 1)])
    assert len(np.unique(epoch)) == len(epoch) == batches.steps_per_epoch * 100
    next_epoch = batches.indices_at(batches.steps_per_epoch + 1)
    assert not np.array_equal(next_epoch, batches.indices_at(1))
    with pytest.raises(LayerwiseError, match="fewer than the global batch"):
        GlobalBatches(data, len(data) + 1, seed=0)


@pytest.fixture
def one_thread():
    """Tiny convolutions run far faster on one thread than on two contended ones."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_synthetic_data_fits_any_model_and_a_small_cnn_learns_it(one_thread):
    data = load_dataset("synthetic", 8, 10, 3, seed=0)
    x, y = data.train.take(np.arange(32))
    assert x.shape == (32, 3, 8, 8) and x.dtype == np.float32 and y.dtype == np.int64
    assert set(np.unique(y)) <= set(range(10))
    wide, _ = load_dataset("synthetic", 40, 1000, 5, seed=0).train.take(np.arange(2))
    assert wide.shape == (2, 5, 40, 40)
    torch.manual_seed(0)
    model = build_model("tiny_cnn", num_classes=10, image_size=8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    batches = GlobalBatches(data.train, 32, seed=0)
    for step in range(1, 31):
        inputs, targets = (torch.from_numpy(a) for a in batches.batch_at(step))
        optimizer.zero_grad()
        F.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
    model.eval()
    val_x, val_y = data.val.take(np.arange(256))
    with torch.no_grad():
        predicted = model(torch.from_numpy(val_x)).argmax(1).numpy()
    assert (predicted == val_y).mean() > 0.5  # chance is 0.1


def test_digits_are_read_as_prepared_and_mismatches_are_one_line(tmp_path):
    with pytest.raises(LayerwiseError, match="dvc repro prepare"):
        load_dataset("digits", 8, 10, 1, seed=0, root=tmp_path)
    meta = prepare_digits(tmp_path / "digits", image_size=8, val_fraction=0.2, seed=0)
    data = load_dataset("digits", 8, 10, 1, seed=0, root=tmp_path)
    assert len(data.train) == meta["train"] and len(data.val) == meta["val"]
    x, y = GlobalBatches(data.train, 16, seed=0).batch_at(1)
    assert x.shape == (16, 1, 8, 8) and y.shape == (16,)
    with pytest.raises(LayerwiseError, match="prepared at 8x8 .* --image-size 8"):
        load_dataset("digits", 16, 10, 1, seed=0, root=tmp_path)
    with pytest.raises(LayerwiseError, match="--in-channels 1"):
        load_dataset("digits", 8, 10, 3, seed=0, root=tmp_path)
    with pytest.raises(LayerwiseError, match="unknown dataset"):
        load_dataset("imagenet", 8, 10, 3, seed=0)


def test_cifar_and_image_folders_load_like_digits(tmp_path):
    """Any folder the prepare stage wrote trains by its name, with the same fit checks."""
    root = tmp_path / "prepared"
    write_cifar(tmp_path / "cifar", batch_sizes=(4, 4, 4, 4, 4), test_size=6)
    prepare_cifar(tmp_path / "cifar", root / "cifar10", image_size=8)
    cifar = load_dataset("cifar10", 8, 3, 3, seed=0, root=root)
    assert cifar.spec == ImageSpec(image_size=8, classes=3, channels=3)
    x, y = GlobalBatches(cifar.train, 8, seed=0).batch_at(2)
    assert x.shape == (8, 3, 8, 8) and x.dtype == np.float32 and y.dtype == np.int64
    assert len(cifar.val) == 6
    with pytest.raises(LayerwiseError, match="--in-channels 3"):
        load_dataset("cifar10", 8, 3, 1, seed=0, root=root)
    with pytest.raises(LayerwiseError, match="--classes 3"):
        load_dataset("cifar10", 8, 10, 3, seed=0, root=root)
    with pytest.raises(LayerwiseError, match="prepared at 8x8 .* --dataset cifar10 --source "
                                             "PATH --image-size 16"):
        load_dataset("cifar10", 16, 3, 3, seed=0, root=root)
    with pytest.raises(LayerwiseError, match="imagefolder dataset is not prepared .* "
                                             "--dataset imagefolder --source PATH"):
        load_dataset("imagefolder", 8, 3, 3, seed=0, root=root)
    write_image_tree(tmp_path / "tree")
    prepare_imagefolder(tmp_path / "tree", root / "flowers", image_size=8, channels=1,
                        val_fraction=0.2, seed=0)
    flowers = load_dataset("flowers", 8, 3, 1, seed=0, root=root)
    x, y = GlobalBatches(flowers.train, 4, seed=0).batch_at(1)
    assert x.shape == (4, 1, 8, 8) and set(y) <= {0, 1, 2}
    with pytest.raises(LayerwiseError, match="--out data/prepared/flowers --image-size 16"):
        load_dataset("flowers", 16, 3, 1, seed=0, root=root)
