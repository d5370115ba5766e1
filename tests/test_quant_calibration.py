"""Calibration of post-training quantisation (addernet/quant/cli.py, calibration.py): what it reads and how,
independent of the loader's workers."""

import pytest
import torch

from addernet.models import build_model
from addernet.quant import calibration_loader, quantize_for_eval

from helpers import CIFAR10_CLASSES, compose, write_jpeg_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """An ImageFolder tree with train/ (30 images) and test/ (10): data=cifar10_folder data.root=<it>."""
    root = tmp_path_factory.mktemp("calib")
    write_jpeg_folder(root / "train", 3, CIFAR10_CLASSES)
    write_jpeg_folder(root / "test", 1, CIFAR10_CLASSES, seed=1)
    return root


def _cfg(folder, *overrides):
    return compose(
        [
            "model=resnet20",
            "data=cifar10_folder",
            f"data.root={folder}",
            "data.pin_memory=false",
            "trainer.progress=false",
            "quant.bits=8",
            "quant.calib_images=24",
            "quant.calib_batch_size=8",
            *overrides,
        ],
        config_name="test",
    )


@torch.no_grad()
def _resnet20():
    """A random ResNet-20 whose BatchNorm statistics are its own activations' (so every adder layer sees inputs)."""
    torch.manual_seed(0)
    model = build_model("resnet20")
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.momentum = None
    model.train()(torch.randn(16, 3, 32, 32))
    return model.eval()


def _images(loader):
    return torch.cat([images for images, _ in loader])


def test_augmented_calibration_images_do_not_depend_on_the_loader_workers(folder):
    """Image i's augmentation is seeded by (quant.seed, i): the same tensors with 0, 1 or 2 workers, and in
    another batch size; the un-augmented images differ from them (the augmentation is really on)."""
    got = {w: _images(calibration_loader(_cfg(folder, f"data.num_workers={w}"), augment=True)) for w in (0, 1, 2)}
    assert torch.equal(got[0], got[1]) and torch.equal(got[0], got[2])
    rebatched = _images(calibration_loader(_cfg(folder, "data.num_workers=2", "quant.calib_batch_size=3"), True))
    assert torch.equal(got[0], rebatched)
    plain = _images(calibration_loader(_cfg(folder, "data.num_workers=0"), augment=False))
    assert plain.shape == got[0].shape and not torch.equal(plain, got[0])
    other_seed = _images(calibration_loader(_cfg(folder, "data.num_workers=0", "quant.seed=1"), augment=True))
    assert not torch.equal(other_seed, got[0])


@pytest.mark.slow  # two calibrations of a ResNet-20, worker processes
def test_the_calibrated_model_does_not_depend_on_the_loader_workers(folder):
    """The BatchNorm statistics re-estimated on augmented images (quant.bn_augment=true) and every quantised
    buffer are equal with 0 and 2 loader workers."""
    states = []
    for workers in (0, 2):
        model = _resnet20()
        torch.manual_seed(123 + workers)  # whatever the global RNG holds before calibrating
        quantize_for_eval(model, _cfg(folder, f"data.num_workers={workers}"))
        states.append(model.state_dict())
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
