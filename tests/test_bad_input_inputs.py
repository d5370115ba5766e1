"""Inputs are what they claim (docs/reliability.md, "Images", "Unknown keys", "Outputs", "Stored models"):
images are never silently mangled or counted twice, every key a user passes is applied or refused, outputs
never overwrite a run's own files, and every entry point checks the stored model like test.py.
"""
import os
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from addernet.data import DataError, build_dataset, build_loader
from addernet.data.datasets import load_rgb
from helpers import compose, write_jpeg_folder

FAST = ["trainer.progress=false", "data.num_workers=0", "data.pin_memory=false", "trainer.log_every=1"]


def _folder(root, *extra):
    return ["data=cifar10_folder", f"data.root={root}", "data.num_classes=4", "data.batch_size=16",
            "model=lenet5_bn", "data.image_size=28", "trainer.epochs=1", *FAST, *extra]


@pytest.fixture
def small_folder(tmp_path):
    root = tmp_path / "data"
    write_jpeg_folder(root / "train", 3, seed=1)
    write_jpeg_folder(root / "test", 2, seed=2)
    return root


# --- images ---------------------------------------------------------------------------------------------------------

def test_symlink_loop_and_second_links_count_each_file_once(small_folder):
    bird = small_folder / "test" / "bird"
    os.symlink(bird, bird / "loop")  # a folder that contains itself
    os.symlink(small_folder / "test" / "cat", bird / "cats")  # a second way into cat/'s files
    ds = build_dataset(compose(_folder(small_folder)).data, "val")
    real = [os.path.realpath(p) for p, _ in ds.samples]
    assert len(ds) == 8 and len(set(real)) == 8  # 4 classes x 2 files, each once
    assert sorted(t for _, t in ds.samples) == [0, 0, 1, 1, 2, 2, 3, 3]  # cat's files keep cat's label


def test_image_of_the_wrong_size_in_a_cifar_folder_is_refused(small_folder):
    big = small_folder / "test" / "cat" / "big.png"
    Image.fromarray(np.zeros((64, 64, 3), np.uint8)).save(big)
    cfg = compose(_folder(small_folder)).data
    with pytest.raises(DataError, match=rf"image {big} is 64x64, but this dataset's images are 32x32; its crop "
                                        r"would keep only part"):
        list(build_loader(cfg, "val"))


def test_16_bit_png_is_scaled_to_8_bits_not_clipped_white(tmp_path):
    ramp = (np.arange(32 * 32, dtype=np.uint16).reshape(32, 32) * 64).astype(np.uint16)  # 0 .. 65472
    path = tmp_path / "deep.png"
    Image.fromarray(ramp).save(path)  # a 16-bit greyscale PNG
    assert Image.open(path).mode.startswith("I")
    rgb = np.asarray(load_rgb(path))
    assert rgb.shape == (32, 32, 3) and (rgb[..., 0] == (ramp >> 8)).all()  # the 8 high bits, not 255
    assert rgb.min() == 0 and rgb.max() == 255 and len(np.unique(rgb)) == 256


@pytest.mark.parametrize("skip", [False, True])
def test_decompression_bomb_is_a_corrupt_image(small_folder, monkeypatch, skip):
    bomb = small_folder / "test" / "cat" / "bomb.png"
    Image.fromarray(np.zeros((64, 64), np.uint8)).save(bomb)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 64x64 = 4096 > 2 x 1000: PIL's bomb error
    cfg = compose(_folder(small_folder, f"data.skip_corrupt={str(skip).lower()}")).data
    if not skip:
        with pytest.raises(DataError, match=rf"cannot read image {bomb} \(Image size \(4096 pixels\) exceeds") as e:
            list(build_loader(cfg, "val"))
        assert "\n" not in str(e.value)
    else:
        loader = build_loader(cfg, "val")
        assert sum(len(t) for _, t in loader) == 8 and loader.dataset.dataset.skipped.value == 1
