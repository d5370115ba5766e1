"""Inputs are what they claim (docs/reliability.md, "Images", "Unknown keys", "Outputs", "Stored models"):
images are never silently mangled or counted twice, every key a user passes is applied or refused, outputs
never overwrite a run's own files, run dirs and results files that cannot be written are one message, and
every entry point checks the stored model like test.py.
"""

import errno
import os
import shutil
import sys

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image

from addernet.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from addernet.data import DataError, build_dataset, build_loader
from addernet.data.datasets import load_rgb
from addernet.engine import check_config, evaluation, rundir, train
from addernet.engine.evaluation import evaluate_checkpoint
from addernet.errors import ConfigError
from addernet.models import build_model

from helpers import (
    CIFAR10_CLASSES,
    FAKE,
    REPO,
    TINY_RUN,
    compose,
    folder_run,
    run_entry,
    run_main,
    run_train,
    write_jpeg_folder,
)


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
    ds = build_dataset(compose(folder_run(small_folder)).data, "val")
    real = [os.path.realpath(p) for p, _ in ds.samples]
    assert len(ds) == 8 and len(set(real)) == 8  # 4 classes x 2 files, each once
    assert sorted(t for _, t in ds.samples) == [0, 0, 1, 1, 2, 2, 3, 3]  # cat's files keep cat's label


def test_image_of_the_wrong_size_in_a_cifar_folder_is_refused(small_folder):
    big = small_folder / "test" / "cat" / "big.png"
    Image.fromarray(np.zeros((64, 64, 3), np.uint8)).save(big)
    cfg = compose(folder_run(small_folder)).data
    with pytest.raises(
        DataError,
        match=rf"image {big} is 64x64, but this dataset's images are 32x32; its crop "
        r"would keep only part",
    ):
        list(build_loader(cfg, "val"))


def test_16_bit_png_is_scaled_to_8_bits_not_clipped_white(tmp_path):
    ramp = (np.arange(32 * 32, dtype=np.uint16).reshape(32, 32) * 64).astype(np.uint16)  # 0 .. 65472
    path = tmp_path / "deep.png"
    Image.fromarray(ramp).save(path)  # a 16-bit greyscale PNG
    assert Image.open(path).mode.startswith("I")
    rgb = np.asarray(load_rgb(path))
    assert rgb.shape == (32, 32, 3) and (rgb[..., 0] == (ramp >> 8)).all()  # the 8 high bits, not 255
    assert rgb.min() == 0 and rgb.max() == 255 and len(np.unique(rgb)) == 256


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")  # the folder's 32x32 images
@pytest.mark.parametrize("skip", [False, True])
def test_decompression_bomb_is_a_corrupt_image(small_folder, monkeypatch, skip):
    bomb = small_folder / "test" / "cat" / "bomb.png"
    Image.fromarray(np.zeros((64, 64), np.uint8)).save(bomb)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 64x64 = 4096 > 2 x 1000: PIL's bomb error
    cfg = compose(folder_run(small_folder, f"data.skip_corrupt={str(skip).lower()}")).data
    if not skip:
        with pytest.raises(DataError, match=rf"cannot read image {bomb} \(Image size \(4096 pixels\) exceeds") as e:
            list(build_loader(cfg, "val"))
        assert "\n" not in str(e.value)
    else:
        loader = build_loader(cfg, "val")
        assert sum(len(t) for _, t in loader) == 8 and loader.dataset.dataset.skipped.value == 1


def test_names_in_different_unicode_forms_are_shown_by_code_point(small_folder):
    import unicodedata

    from addernet.data import check_classes

    nfd, nfc = unicodedata.normalize("NFD", "café"), unicodedata.normalize("NFC", "café")
    val = small_folder / "nfd"
    for c in ("airplane", "automobile", "bird", nfd):
        shutil.copytree(small_folder / "test" / "cat", val / c)
    ds = build_dataset(compose(folder_run(small_folder, f"data.val_dir={val}")).data, "val")
    with pytest.raises(DataError, match=r"same name in different Unicode forms: 'cafe\\u0301' vs 'caf\\xe9'"):
        check_classes(["airplane", "automobile", "bird", nfc], ds, "the training set", "rename it")


# --- unknown keys, group choices, run dirs: one line, exit 2 --------------------------------------------------------


def test_unknown_top_level_keys_are_refused_once_composed():
    from addernet.engine import ConfigError, check_config

    with pytest.raises(ConfigError, match=r"unknown key epochs \(did you mean trainer.epochs\?\)"):
        check_config(compose(["data=fake", "model=lenet5_bn", "data.image_size=28", "+epochs=3"]))


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda tmp: (tmp / "file").write_text("x") and str(tmp / "file" / "run"), "Not a directory"),
        (lambda tmp: str(tmp / ("x" * 300)), "File name too long"),
    ],
)
def test_run_dirs_that_cannot_be_created_are_one_line(tmp_path, make, message, monkeypatch, capsys):
    from addernet.train import main

    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    monkeypatch.setattr(sys, "argv", ["train.py", "data=fake", f"hydra.run.dir={make(tmp_path)}"])
    with pytest.raises(SystemExit) as exit_:
        main()
    error = capsys.readouterr().err
    assert exit_.value.code == 2 and error.startswith("train.py: error: cannot create")
    assert message in error and error.count("\n") == 1


@pytest.mark.parametrize(
    "argv, message, process",
    [
        (["trainer.epoch=3"], "train.py: error: unknown key trainer.epoch (did you mean trainer.epochs?)", True),
        (["model=resnet21"], "train.py: error: model=resnet21 is not an option of model (did you mean resnet", False),
        (["+epochs=3"], "train.py: error: unknown key epochs (did you mean trainer.epochs?)", False),
        (["+optim.lrr=0.1"], "train.py: error: unknown key optim.lrr (did you mean optim.lr?)", False),
    ],
)
def test_train_py_exits_2_with_one_line_for_what_hydra_rejects(tmp_path, argv, message, process):
    from addernet.train import main as train_py

    args = argv + [f"hydra.run.dir={tmp_path / 'run'}"]  # one case as a new process, the rest in this one
    r = run_train(args, timeout=120) if process else run_main(train_py, "train.py", args)
    assert r.returncode == 2 and r.stderr.strip().startswith(message) and len(r.stderr.strip().splitlines()) == 1
    if not argv[0].startswith("+"):  # refused by Hydra while composing: nothing written
        assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


# --- outputs never overwrite a run's files; every entry point checks the stored model like test.py ------------------


def _eval_args(checkpoint, *extra):
    return [f"checkpoint={checkpoint}", "trainer.progress=false", *extra]


def _eval_cfg(checkpoint, *overrides):
    """test.py's composed config and the overrides it passes on (what the user typed)."""
    args = [f"checkpoint={checkpoint}", "trainer.progress=false", "data.download=false", *overrides]
    return compose(args, config_name="test"), args


def test_results_file_never_replaces_a_checkpoint_or_a_run_file(finished_tiny_run, tmp_path):
    from addernet.engine import ConfigError
    from addernet.engine.evaluation import check_results_file, report

    best, last = finished_tiny_run / "checkpoints" / "best.pt", finished_tiny_run / "checkpoints" / "last.pt"
    kept = last.read_bytes()
    with pytest.raises(ConfigError, match=r"results_file=.*best.pt is the input checkpoint itself"):
        check_results_file(str(best), str(best))
    for other in (last, finished_tiny_run / "metrics.jsonl", finished_tiny_run / "config.yaml"):
        with pytest.raises(ConfigError, match=r"exists and is not a results file \(one JSON line\)"):
            check_results_file(str(other), str(best))
    assert last.read_bytes() == kept
    earlier = tmp_path / "r.json"  # an earlier results file may be replaced
    report({"top1": 1.0, "top5": 2.0, "loss": 3.0, "n": 4, "images_per_s": 5.0}, str(earlier))
    check_results_file(str(earlier), str(best))


def test_scripts_refuse_an_adder_checkpoint_as_its_cnn_twin(finished_tiny_run):
    from addernet.engine import ConfigError
    from addernet.engine.evaluation import load_float_model

    best = finished_tiny_run / "checkpoints" / "best.pt"
    for entry in ("export_onnx", "quantize"):
        args = _eval_args(best, "model.layer=conv", "out=x.onnx")
        with pytest.raises(
            ConfigError,
            match=r"trained as a different model: model.layer=conv \(trained as "
            r"model.layer=adder\)",
        ):
            load_float_model(compose(args, config_name=entry), args, entry=entry)


def test_an_override_the_evaluated_dataset_ignores_is_refused(finished_tiny_run):
    from addernet.engine import ConfigError
    from addernet.engine.evaluation import evaluate_checkpoint

    args = _eval_args(finished_tiny_run / "checkpoints" / "best.pt", "data=fake", "+data.val_dir=/somewhere/else")
    with pytest.raises(ConfigError, match=r"unknown key data.val_dir .*data=fake has no such setting"):
        evaluate_checkpoint(compose(args, config_name="test"), args)


def test_quantize_out_never_replaces_a_training_checkpoint(finished_tiny_run):
    last = finished_tiny_run / "checkpoints" / "last.pt"
    kept = last.read_bytes()
    r = run_entry(
        "scripts/quantize.py",
        [
            f"checkpoint={finished_tiny_run / 'checkpoints' / 'best.pt'}",
            f"out={last}",
            "quant.bits=8",
            "quant.calib_images=8",
            "quant.calib_batch_size=4",
        ],
    )
    assert r.returncode == 2 and f"out={last} exists; it is not replaced unless you pass overwrite=true" in r.stderr
    assert last.read_bytes() == kept


# --- files: disk full, umask, zip bombs -----------------------------------------------------------------------------


def test_disk_full_is_named_by_the_os_error(tmp_path, monkeypatch):
    from addernet.checkpoint import CheckpointError, save_checkpoint
    from addernet.checkpoint import io as ckpt_io

    real = os.fdopen
    monkeypatch.setattr(ckpt_io.os, "fdopen", lambda fd, mode: real(os.open("/dev/full", os.O_WRONLY), mode))
    with pytest.raises(CheckpointError, match=r"cannot write checkpoint .*x.pt: no space left on device; no earlier"):
        save_checkpoint({"w": torch.zeros(1000)}, tmp_path / "x.pt")
    assert os.listdir(tmp_path) == []  # the temporary file is removed


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_checkpoint_files_follow_the_umask(tmp_path, mask, mode):
    from addernet.checkpoint import save_checkpoint

    old = os.umask(mask)
    try:
        save_checkpoint({"w": torch.zeros(2)}, tmp_path / "x.pt")
    finally:
        os.umask(old)
    assert (os.stat(tmp_path / "x.pt").st_mode & 0o777) == mode


def test_a_zip_bomb_checkpoint_is_refused_before_reading(tmp_path):
    import zipfile

    from addernet.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

    good = tmp_path / "good.pt"
    save_checkpoint({"w": torch.zeros(4)}, good)
    bomb = tmp_path / "bomb.pt"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(bomb, "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info.filename), compress_type=zipfile.ZIP_DEFLATED)
        dst.writestr("good/data/99", b"\0" * (64 << 20), compress_type=zipfile.ZIP_DEFLATED)  # 64 MiB of zeros
    assert bomb.stat().st_size < 1 << 20
    with pytest.raises(CheckpointError, match=r"expand to \d+ bytes of compressed entries"):
        load_checkpoint(bomb)
    assert torch.equal(load_checkpoint(good)["w"], torch.zeros(4))


def test_calibration_never_ends_with_a_batch_of_one(finished_tiny_run):
    from addernet.engine import ConfigError
    from addernet.quant.cli import calibration_loader

    args = _eval_args(finished_tiny_run / "checkpoints" / "best.pt")
    cfg = compose(
        args + ["data=fake", "data.train_size=32", "data.image_size=28", "quant.calib_images=1"], config_name="test"
    )
    with pytest.raises(ConfigError, match=r"quant.calib_images=1 .*needs batches of at least 2 images"):
        calibration_loader(cfg)
    cfg = compose(
        args
        + ["data=fake", "data.train_size=32", "data.image_size=28", "quant.calib_images=9", "quant.calib_batch_size=4"],
        config_name="test",
    )
    assert [len(t) for _, t in calibration_loader(cfg)] == [4, 4]  # the 9th image would be a batch of 1


@pytest.mark.slow
def test_a_failed_multirun_job_is_recorded_and_the_sweep_goes_on(tmp_path):
    sweep = tmp_path / "sweep"
    r = run_train(["-m", *FAKE, "trainer.epochs=1", "trainer.amp=bogus,off", f"hydra.sweep.dir={sweep}"], timeout=300)
    assert r.returncode == 2, r.stderr[-3000:]
    [job0], [job1] = sweep.glob("0_*"), sweep.glob("1_*")  # job dirs are named <number>_<overrides>
    assert "trainer.amp='bogus' is not valid" in (job0 / "error.txt").read_text()
    assert (job0 / "error.txt").read_text().startswith("exit code 2\n")
    failures = (sweep / "failures.log").read_text().splitlines()
    assert len(failures) == 1 and failures[0].startswith("job 0 (") and "exit code 2" in failures[0]
    assert len((job1 / "metrics.jsonl").read_text().splitlines()) == 1  # job 1 ran to the end


def test_a_bare_state_dict_is_not_evaluated_as_the_other_twin(finished_tiny_run, tmp_path):
    """No stored config: the BatchNorm running means after the body layers tell adder (all negative) from conv."""
    from addernet.checkpoint import load_checkpoint, save_checkpoint
    from addernet.engine import ConfigError
    from addernet.engine.evaluation import evaluate_checkpoint

    bare = tmp_path / "bare.pt"
    save_checkpoint(load_checkpoint(finished_tiny_run / "checkpoints" / "best.pt")["model"], bare)
    common = _eval_args(bare, *TINY_RUN, "data.val_size=8", "trainer.log_every=1")
    args = common + ["model.layer=conv"]
    with pytest.raises(
        ConfigError,
        match=r"bare.pt holds weights trained as model.layer=adder .*built with "
        r"model.layer=conv",
    ):
        evaluate_checkpoint(compose(args, config_name="test"), args)
    args = common + ["model.layer=adder"]
    assert evaluate_checkpoint(compose(args, config_name="test"), args)["n"] == 8


def test_train_py_help_lists_only_the_groups_train_py_accepts():
    r = run_entry("train.py", ["--help"])
    groups = [
        line.split(":")[0]
        for line in r.stdout.split("== Configuration groups ==")[1].split("== Config ==")[0].splitlines()
        if ": " in line
    ]
    assert r.returncode == 0 and groups == [
        "adaptive_lr",
        "data",
        "experiment",
        "hparams_search",
        "logger",
        "model",
        "optim",
        "sched",
        "task",
        "trainer",
    ]


# --- an adder checkpoint is never evaluated as its CNN twin ---------------------------------------------------------


def test_test_py_refuses_an_adder_checkpoint_as_conv(tmp_path, monkeypatch):
    monkeypatch.setattr(evaluation, "evaluate", lambda *a, **k: pytest.fail("evaluated the wrong model"))
    path = tmp_path / "adder.pt"
    save_checkpoint(
        {
            "format_version": 1,
            "model": build_model("lenet5_bn", "adder", in_channels=3).state_dict(),
            "config": OmegaConf.to_container(compose(FAKE), resolve=True),
        },
        path,
    )
    cfg, args = _eval_cfg(path, "model.layer=conv")
    with pytest.raises(ConfigError, match=r"model.layer=conv \(trained as model.layer=adder\)"):
        evaluate_checkpoint(cfg, args)


@pytest.mark.slow
def test_converted_official_checkpoint_as_conv_is_refused(converted_r20, monkeypatch):
    """An official AdderNet checkpoint, converted, then evaluated as its CNN twin (test.py ... model.layer=conv)."""
    assert load_checkpoint(converted_r20)["classes"] == CIFAR10_CLASSES
    monkeypatch.setattr(evaluation, "evaluate", lambda *a, **k: pytest.fail("evaluated the wrong model"))
    cfg, args = _eval_cfg(converted_r20, "model.layer=conv")
    with pytest.raises(
        ConfigError,
        match=r"resnet20_official.pt was trained as a different model: model.layer=conv "
        r"\(trained as model.layer=adder\)",
    ):
        evaluate_checkpoint(cfg, args)


def test_read_only_run_dir_is_one_message(tmp_path, monkeypatch):
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(rundir.os, "open", read_only)  # as root, chmod cannot make a dir read-only
    with pytest.raises(
        ConfigError,
        match=f"cannot write to the run dir {tmp_path} \\(Read-only file system\\); "
        f"make it writable or choose another one with hydra.run.dir=",
    ):
        train(compose(FAKE + ["trainer.epochs=1"]), str(tmp_path))


def test_unwritable_results_file_fails_before_evaluating(tmp_path, monkeypatch):
    monkeypatch.setattr(evaluation, "evaluate", lambda *a, **k: pytest.fail("evaluated before checking results_file"))
    path = tmp_path / "ckpt.pt"
    save_checkpoint(
        {
            "format_version": 1,
            "model": build_model("lenet5_bn", "adder", in_channels=3).state_dict(),
            "config": OmegaConf.to_container(compose(FAKE), resolve=True),
        },
        path,
    )
    (tmp_path / "a_file").write_text("x")
    for target, reason in (
        (tmp_path, "Is a directory"),
        (tmp_path / "a_file" / "r.json", "File exists|Not a directory"),
    ):
        cfg, args = _eval_cfg(path, f"results_file={target}")
        with pytest.raises(ConfigError, match=f"results_file={target} cannot be written \\(({reason})\\)"):
            evaluate_checkpoint(cfg, args)


@pytest.mark.slow
def test_bare_tensor_and_random_bytes_are_named_as_not_checkpoints(tmp_path):
    tensor = tmp_path / "tensor.pt"
    torch.save(torch.zeros(3), tensor)
    r = run_train([f"checkpoint={tensor}", "data.download=false"], script=("test.py",), timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "is neither a checkpoint of this repo" in r.stderr and "found: Tensor" in r.stderr
    noise = tmp_path / "noise.pt"
    noise.write_bytes(bytes(range(7, 256)) * 20)
    with pytest.raises(CheckpointError, match="noise.pt is not a checkpoint: it is neither a torch.save zip") as e:
        load_checkpoint(noise)
    assert "weights_only=False" not in str(e.value)


# --- unknown keys inside the known groups ---------------------------------------------------------------------------


def test_added_unknown_key_is_rejected_with_the_valid_ones(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"unknown key trainer.epoch \(did you mean trainer.epochs\?\).*its settings: (\w+, )*amp, .*epochs",
    ):
        check_config(compose(["+trainer.epoch=1"]))
    with pytest.raises(ConfigError, match=r"unknown key data.val_dri \(did you mean data.val_size\?\): data=mnist has"):
        evaluate_checkpoint(*_eval_cfg(REPO / "addernet" / "zoo" / "mnist_lenet5_bn_adder.pt", "+data.val_dri=/x"))


# --- the command line: values Hydra's grammar cannot read, a preset's key the chosen option lacks ------------------


@pytest.mark.parametrize("name", ["a=b", "a,b", "~", "a~b", "café", "a(1)", "it's"])
def test_a_path_the_override_grammar_cannot_read_gets_its_quoted_form(tmp_path, name):
    """The suggested form, given as it is printed, reads as the path itself."""
    import re
    import shlex

    from addernet.train import main as train_py

    from helpers import run_main

    path = f"{tmp_path}/{name}/run"
    proc = run_main(train_py, "train.py", [*FAKE, f"hydra.run.dir={path}"])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"train.py: error: cannot read the value of hydra.run.dir={path}: ")
    quoted = shlex.split(re.search(r"quote the value: (.*?)(?: \(quoted, a leading ~.*)?\.$", proc.stderr).group(1))
    shown = run_main(train_py, "train.py", [*quoted, "--cfg", "hydra", "--package", "hydra.run"])
    assert shown.returncode == 0, shown.stderr
    assert OmegaConf.create(shown.stdout).dir == path
    assert not os.path.exists(tmp_path / name)


def test_a_key_of_the_preset_that_the_chosen_option_lacks_is_named():
    from addernet.train import main as train_py

    from helpers import run_main

    proc = run_main(train_py, "train.py", ["experiment=mnist_lenet5_bn_adder", "model=resnet20"])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(
        "train.py: error: experiment=mnist_lenet5_bn_adder sets model.adder_layers, which model=resnet20 does not have"
    )
    assert "Drop model=resnet20" in proc.stderr
