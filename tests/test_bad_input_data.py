"""Datasets and loaders never give a silently wrong result (docs/reliability.md, "Images"): class folders are
matched by name, empty or corrupt data and impossible batch or input sizes are one clear error, loader workers
fit the machine. Tiny in-process runs (JPEG folders, FakeData, LeNet-5-BN at 28x28); one train.py process.
"""

import multiprocessing
import os
import shutil

import pytest

from addernet.checkpoint import load_checkpoint
from addernet.data import DataError, build_dataset, build_loader, iter_from, num_workers
from addernet.engine import ConfigError, check_config, evaluation, train
from addernet.engine.evaluation import evaluate_checkpoint

from helpers import (
    CIFAR10_CLASSES,
    CIFAR_SAMPLE,
    FAKE,
    OFFICIAL_R20,
    compose,
    folder_run,
    needs_shared,
    run_train,
)


def _eval_cfg(checkpoint, *overrides):
    """test.py's composed config and the overrides it passes on (what the user typed)."""
    args = [f"checkpoint={checkpoint}", "trainer.progress=false", "data.download=false", *overrides]
    return compose(args, config_name="test"), args


# --- class folders are matched by name, not by sorted position--- ---------------------------------------------------


def _renamed(src, dst, old="airplane", new="zeppelin"):
    """A copy of the ImageFolder ``src`` (class folders as symlinks) with class ``old`` renamed to ``new``."""
    dst.mkdir()
    for c in sorted(os.listdir(src)):
        os.symlink(src / c, dst / (new if c == old else c))
    return dst


def test_training_refuses_val_classes_that_differ_from_train(tmp_path, jpeg_cifar):
    root = tmp_path / "data"
    shutil.copytree(jpeg_cifar / "train", root / "train")
    _renamed(jpeg_cifar / "test", root / "test")
    with pytest.raises(DataError, match="'zeppelin' where the training set .*train has 'airplane'"):
        train(compose(folder_run(root)), str(tmp_path / "run"))


def test_checkpoint_stores_class_names_and_test_py_checks_them(tmp_path, jpeg_cifar):
    run = tmp_path / "run"
    train(compose(folder_run(jpeg_cifar)), str(run))
    best = run / "checkpoints" / "best.pt"
    assert load_checkpoint(best)["classes"] == CIFAR10_CLASSES[:4]
    renamed = _renamed(jpeg_cifar / "test", tmp_path / "renamed")
    cfg, args = _eval_cfg(best, "data=cifar10_folder", f"data.val_dir={renamed}")
    with pytest.raises(DataError, match=f"classes of {renamed} do not match .*'zeppelin' where .* has 'airplane'"):
        evaluate_checkpoint(cfg, args[:-2] + args[-1:])  # data= is implied by test.py, not given by the user
    cfg, args = _eval_cfg(best, "data=cifar10_folder", f"data.val_dir={jpeg_cifar / 'test'}")
    assert evaluate_checkpoint(cfg, args[:-2] + args[-1:])["n"] == 37  # the right folder still evaluates


@needs_shared("official/ResNet20-AdderNet.pth", "cifar10-test-sample")
def test_official_resnet20_refuses_a_renamed_cifar10_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(evaluation, "evaluate", lambda *a, **k: pytest.fail("evaluated despite the wrong classes"))
    renamed = _renamed(CIFAR_SAMPLE, tmp_path / "sample")
    cfg, args = _eval_cfg(OFFICIAL_R20, "model=resnet20", "data=cifar10_folder", f"data.val_dir={renamed}")
    with pytest.raises(
        DataError, match="'zeppelin' where the classes .*ResNet20-AdderNet.pth was trained on has 'airplane'"
    ):
        evaluate_checkpoint(cfg, args)


# --- empty datasets -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override, message",
    [
        ("data.train_size=0", "the fake train set is empty .*data.train_size"),
        ("data.val_size=0", "the fake val set is empty .*data.val_size"),
        ("data.train_size=1", "training set has 1 image.*fewer than 2 per process"),
    ],
)
def test_empty_datasets_are_errors(tmp_path, override, message):
    with pytest.raises(DataError, match=message):
        train(compose(FAKE + ["trainer.epochs=1", override]), str(tmp_path / "run"))
    assert not os.listdir(tmp_path / "run" / "checkpoints")


def test_image_folder_without_images_is_an_error(tmp_path):
    for c in CIFAR10_CLASSES[:4]:
        (tmp_path / "test" / c).mkdir(parents=True)
    with pytest.raises(DataError, match="not a usable ImageFolder tree|is empty"):
        build_dataset(compose(folder_run(tmp_path)).data, "val")


# --- corrupt images -------------------------------------------------------------------------------------------------


@pytest.fixture
def corrupt_folder(tmp_path, jpeg_cifar):
    root = tmp_path / "data"
    shutil.copytree(jpeg_cifar, root)
    bad = root / "train" / "bird" / "3.jpg"
    bad.write_bytes(bad.read_bytes()[:200])  # truncated mid-file
    return root, bad


@pytest.mark.parametrize("workers", [0, 1])
def test_corrupt_image_names_the_file_and_the_dataset(corrupt_folder, workers):
    root, bad = corrupt_folder
    cfg = compose(folder_run(root, f"data.num_workers={workers}")).data
    with pytest.raises(DataError) as e:
        list(iter_from(build_loader(cfg, "train")))  # how the training and evaluation loops iterate
    msg = str(e.value)
    assert msg.startswith(f"cifar10_folder train set: cannot read image {bad}") and "\n" not in msg, msg
    # the worker is shut down with the error, not kept waiting by the iterator its traceback holds
    assert not [child for child in multiprocessing.active_children() if child.daemon]
    assert "data.skip_corrupt=true" in msg


@pytest.mark.slow
def test_train_py_exits_after_a_worker_error(tmp_path, corrupt_folder):
    """The DataError from a worker leaves its iterator alive in the traceback; its workers ignore SIGTERM, so
    without addernet.data.loader.kill_workers_left_at_exit the process hung at exit (in multiprocessing's join)."""
    root, bad = corrupt_folder
    r = run_train(folder_run(root, "data.num_workers=1", f"hydra.run.dir={tmp_path / 'run'}"), timeout=120)
    assert r.returncode == 2 and f"cannot read image {bad}" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr


def test_skip_corrupt_skips_and_reports_per_epoch(tmp_path, corrupt_folder):
    root, bad = corrupt_folder
    run = tmp_path / "run"
    train(compose(folder_run(root, "data.skip_corrupt=true")), str(run))
    log = (run / "train.log").read_text()
    assert f"skipped unreadable image {bad}" in log
    assert "epoch 1: skipped 1 unreadable training and 0 validation image(s)" in log


# --- batch and input sizes ------------------------------------------------------------------------------------------


def test_batch_of_one_is_refused_with_a_valid_suggestion():
    with pytest.raises(ConfigError, match=r"data.batch_size must be an integer >= 2, got 1; e.g. data.batch_size=2"):
        check_config(compose(["data.batch_size=1"]))
    with pytest.raises(DataError, match="gives 1 sample per process .* use data.batch_size=4 or more"):
        build_loader(compose(FAKE + ["data.batch_size=2"]).data, "train", rank=0, world_size=2)
    loader = build_loader(compose(FAKE + ["data.train_size=17"]).data, "train")  # 16 + 1: the 1 is dropped
    assert [len(y) for _, y in loader] == [16]


def test_model_that_cannot_take_the_input_size_is_one_message():
    with pytest.raises(
        ConfigError,
        match=r"model=lenet5_bn cannot take 3x32x32 inputs \(data.image_size=32\).*"
        r"data.image_size=28",
    ):
        check_config(compose(["model=lenet5_bn"]))


# --- the error reaches train.log ------------------------------------------------------------------------------------


def test_failed_run_writes_its_error_to_train_log(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(DataError):
        train(compose(FAKE + ["trainer.epochs=1", "data.val_size=0"]), str(run))
    assert "[ERROR] run stopped: DataError: the fake val set is empty" in (run / "train.log").read_text()


# --- loader workers -------------------------------------------------------------------------------------------------


def test_num_workers_auto_fits_the_machine(monkeypatch):
    cfg = compose(["data.num_workers=auto"]).data
    cpus = len(os.sched_getaffinity(0))
    assert 1 <= num_workers(cfg) <= cpus
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(2 * cpus))  # more processes than CPUs on this machine
    assert num_workers(cfg) == 1
