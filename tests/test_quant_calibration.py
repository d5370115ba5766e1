"""Calibration of post-training quantisation (addernet/quant/cli.py, calibration.py): what it reads and how,
independent of the loader's workers."""

import logging
import re

import pytest
import torch
from omegaconf import OmegaConf

from addernet.checkpoint import save_checkpoint
from addernet.models import build_model
from addernet.quant import calibration_loader, quantize_for_eval
from addernet.test import main as evaluate_main
from addernet.tools import quantize

from helpers import CIFAR10_CLASSES, compose, run_main, write_jpeg_folder


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


# ---- what calibration says, and the settings checked before any work ---------------------------------------


def test_each_calibration_stage_says_when_it_starts_and_what_it_processes(folder, caplog):
    """With trainer.progress=false (no bar), every pass logs its start (what, images, batches) before any batch,
    then its end with the seconds it took."""
    with caplog.at_level(logging.INFO, logger="addernet.quant"):
        quantize_for_eval(_resnet20(), _cfg(folder, "data.num_workers=0"))
    lines = [r.getMessage() for r in caplog.records if r.name == "addernet.quant"]
    starts = [i for i, m in enumerate(lines) if m.endswith("...")]
    assert [lines[i] for i in starts] == [
        "calibration: activation ranges of 20 adder layer(s) on training images, validation transform: "
        "24 image(s) in 3 batch(es) ...",
        "BN re-estimation: 22 BatchNorm layer(s) on augmented training images: 24 image(s) in 3 batch(es) ...",
    ]
    ends = [i for i, m in enumerate(lines) if re.search(r" done, 24 image\(s\) in [0-9.]+ s$", m)]
    assert len(ends) == 2 and starts[0] < ends[0] < starts[1] < ends[1]


def test_asking_for_more_calibration_images_than_exist_is_one_warning_naming_the_count(folder, caplog):
    with caplog.at_level(logging.INFO, logger="addernet.quant"):
        quantize_for_eval(_resnet20(), _cfg(folder, "data.num_workers=0", "quant.calib_images=25600"))
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == [
        "quant.calib_images=25600 is more than the 30 images of the training split of data=cifar10_folder: "
        "calibrating on 30"
    ]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, folder):
    """A ResNet-20 AdderNet checkpoint in our format, for data=cifar10_folder data.root=<folder>."""
    cfg = compose(["model=resnet20", "data=cifar10_folder", f"data.root={folder}"])
    path = tmp_path_factory.mktemp("ckpt") / "best.pt"
    config = OmegaConf.to_container(cfg, resolve=True)
    save_checkpoint({"format_version": 1, "model": _resnet20().state_dict(), "config": config, "epoch": 1}, path)
    return path


BAD_SETTINGS = [
    ("quant.act_range_floor=0", "quant.act_range_floor must be a positive number, got 0.0."),
    ("quant.act_range_floor=-1", "quant.act_range_floor must be a positive number, got -1.0."),
    ("quant.act_range_floor=nan", "quant.act_range_floor must be a positive number, got nan."),
    ("quant.act_range_floor=inf", "quant.act_range_floor must be a positive number, got inf."),
    ("quant.act_quantile=0", "quant.act_quantile=0.0 must be a number in (0, 1], e.g. 0.9994."),
    ("quant.act_quantile=nan", "quant.act_quantile=nan must be a number in (0, 1], e.g. 0.9994."),
    ("quant.act_quantile=1.5", "quant.act_quantile=1.5 must be a number in (0, 1], e.g. 0.9994."),
    ("quant.calib_images=0", "quant.calib_images must be an integer >= 1, got 0; e.g. quant.calib_images=1."),
    (
        "quant.calib_batch_size=-3",
        "quant.calib_batch_size must be an integer >= 1, got -3; e.g. quant.calib_batch_size=1.",
    ),
    ("quant.groups=0", "quant.groups must be an integer >= 1, got 0; e.g. quant.groups=1."),
    ("quant.seed=-1", "quant.seed must be an integer >= 0, got -1; e.g. quant.seed=1."),
    ("quant.bn_momentum=0", "quant.bn_momentum=0.0 must be null (exact average) or a number in (0, 1]."),
    ("quant.bn_momentum=nan", "quant.bn_momentum=nan must be null (exact average) or a number in (0, 1]."),
    (
        "quant.bits=1",
        "quant.bits=1 is not supported: use an integer from 2 to 16 (e.g. quant.bits=8), "
        "or quant.bits=null for the float model.",
    ),
    ("quant.grouping=median", "quant.grouping='median' is not valid; choose one of: kmeans, kmeans_sklearn."),
    ("quant.kernel=gpu", "quant.kernel='gpu' is not valid; choose one of: auto, int, fake."),
    ("quant.runtime=fast", "quant.runtime='fast' is not valid; choose one of: auto, integer, layers."),
    ("quant.weight_grid=log", "quant.weight_grid='log' is not valid; choose one of: unsigned, signed."),
]


@pytest.mark.parametrize(("setting", "message"), BAD_SETTINGS)
@pytest.mark.parametrize("entry", ["test.py", "quantize.py"])
def test_every_quant_setting_is_range_checked_before_any_work(tmp_path, entry, setting, message):
    """One line, exit 2, before the checkpoint is even read (a missing one is not what is reported)."""
    main = {"test.py": evaluate_main, "quantize.py": quantize.cli}[entry]
    args = [f"checkpoint={tmp_path / 'missing.pt'}", setting, "trainer.progress=false"]
    if entry == "quantize.py":
        args += [f"out={tmp_path / 'q.pt'}", *(["quant.bits=8"] if not setting.startswith("quant.bits") else [])]
    r = run_main(main, entry, args)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [f"{entry}: error: {message}"], r.stderr
    assert r.stdout == "" and not (tmp_path / "q.pt").exists()


def test_quantize_without_out_fails_at_once_in_one_line(tmp_path):
    r = run_main(quantize.cli, "quantize.py", [f"checkpoint={tmp_path / 'missing.pt'}", "quant.bits=8"])
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "quantize.py: error: no output file given: add out=PATH, the quantised checkpoint to write (e.g. out=q8.pt)"
    ]


def test_quantize_into_an_unwritable_place_fails_before_calibrating(tmp_path, checkpoint):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    args = [f"checkpoint={checkpoint}", "quant.bits=8", f"out={blocker}/sub/q.pt", "trainer.progress=false"]
    r = run_main(quantize.cli, "quantize.py", args)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"quantize.py: error: out={blocker}/sub/q.pt cannot be written: {blocker} is not a folder; choose another path."
    ]


def test_an_error_found_when_quantising_never_shares_a_line_with_the_test_bar(folder, checkpoint):
    """quant.groups=17 is refused once the model is known (its layers have 16 filters): before the test bar."""
    args = [f"checkpoint={checkpoint}", f"data.root={folder}", "data.num_workers=0", "quant.bits=8", "quant.groups=17"]
    r = run_main(evaluate_main, "test.py", [*args, "trainer.progress=true"])
    assert r.returncode == 2 and r.stderr.splitlines()[-1] == (
        "test.py: error: quant.groups=17 is more than the 16 filters of adder layer layer1.0.conv1; "
        "use quant.groups <= 16."
    ), r.stderr
    assert "test:" not in r.stderr  # the evaluation (and its bar) never started
