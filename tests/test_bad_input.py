"""Bad input and hostile conditions: never a silently wrong result, never a NaN checkpoint,
pre-emption that survives a real scheduler, one clear message per mistake.

Each test names the case it guards. Training runs are in-process (tiny FakeData / JPEG folders,
LeNet-5-BN at 28x28); the signal and concurrency tests start real train.py processes.
"""
import errno
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from omegaconf import OmegaConf

from addernet.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from addernet.data import DataError, build_dataset, build_loader, num_workers
from addernet.engine import ConfigError, NonFiniteLoss, check_config, train
from addernet.engine import eval_run, rundir
from addernet.engine.eval_run import evaluate_checkpoint, report
from addernet.engine.outputs import json_line
from addernet.engine.resume import StopFlag
from addernet.models import build_model
from helpers import CIFAR10_CLASSES, CIFAR_SAMPLE, REPO, SHARED, compose, run_train

FAST = ["trainer.progress=false", "data.num_workers=0", "data.pin_memory=false", "trainer.log_every=1"]
FAKE = ["data=fake", "data.train_size=32", "data.val_size=8", "data.batch_size=16", "model=lenet5_bn",
        "data.image_size=28", *FAST]
OFFICIAL_R20 = SHARED / "official" / "ResNet20-AdderNet.pth"


def _folder(root, *extra):
    return ["data=cifar10_folder", f"data.root={root}", "data.num_classes=4", "data.batch_size=16",
            "model=lenet5_bn", "data.image_size=28", "trainer.epochs=1", *FAST, *extra]


def _strict_json(text):
    """json.loads that fails on NaN / Infinity (Python's json accepts them by default)."""
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in JSON: {text}"))


def _eval_cfg(checkpoint, *overrides):
    """test.py's composed config and the overrides it passes on (what the user typed)."""
    args = [f"checkpoint={checkpoint}", "trainer.progress=false", "data.download=false", *overrides]
    return compose(args, config_name="test"), args


# --- 1. class folders are matched by name, not by sorted position ----------------------------------------------

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
        train(compose(_folder(root)), str(tmp_path / "run"))


def test_checkpoint_stores_class_names_and_test_py_checks_them(tmp_path, jpeg_cifar):
    run = tmp_path / "run"
    train(compose(_folder(jpeg_cifar)), str(run))
    best = run / "checkpoints" / "best.pt"
    assert load_checkpoint(best)["classes"] == CIFAR10_CLASSES[:4]
    renamed = _renamed(jpeg_cifar / "test", tmp_path / "renamed")
    cfg, args = _eval_cfg(best, "data=cifar10_folder", f"data.val_dir={renamed}")
    with pytest.raises(DataError, match=f"classes of {renamed} do not match .*'zeppelin' where .* has 'airplane'"):
        evaluate_checkpoint(cfg, args[:-2] + args[-1:])  # data= is implied by test.py, not given by the user
    cfg, args = _eval_cfg(best, "data=cifar10_folder", f"data.val_dir={jpeg_cifar / 'test'}")
    assert evaluate_checkpoint(cfg, args[:-2] + args[-1:])["n"] == 37  # the right folder still evaluates


@pytest.mark.skipif(not (OFFICIAL_R20.is_file() and CIFAR_SAMPLE.is_dir()), reason=f"shared data not in {SHARED}")
def test_official_resnet20_refuses_a_renamed_cifar10_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(eval_run, "evaluate", lambda *a, **k: pytest.fail("evaluated despite the wrong classes"))
    renamed = _renamed(CIFAR_SAMPLE, tmp_path / "sample")
    cfg, args = _eval_cfg(OFFICIAL_R20, "model=resnet20", "data=cifar10_folder", f"data.val_dir={renamed}")
    with pytest.raises(DataError, match="'zeppelin' where the classes .*ResNet20-AdderNet.pth was trained on has "
                                        "'airplane'"):
        evaluate_checkpoint(cfg, args)


# --- 2. an adder checkpoint is never evaluated or resumed as its CNN twin ---------------------------------------

def test_test_py_refuses_an_adder_checkpoint_as_conv(tmp_path, monkeypatch):
    monkeypatch.setattr(eval_run, "evaluate", lambda *a, **k: pytest.fail("evaluated the wrong model"))
    path = tmp_path / "adder.pt"
    save_checkpoint({"format_version": 1, "model": build_model("lenet5_bn", "adder", in_channels=3).state_dict(),
                     "config": OmegaConf.to_container(compose(FAKE), resolve=True)}, path)
    cfg, args = _eval_cfg(path, "model.layer=conv")
    with pytest.raises(ConfigError, match=r"model.layer=conv \(trained as model.layer=adder\)"):
        evaluate_checkpoint(cfg, args)


@pytest.mark.skipif(not OFFICIAL_R20.is_file(), reason=f"official checkpoint not found at {OFFICIAL_R20}")
def test_converted_official_checkpoint_as_conv_is_refused(tmp_path, monkeypatch):
    """An official AdderNet checkpoint, converted, then evaluated as its CNN twin (test.py ... model.layer=conv)."""
    r20 = tmp_path / "r20.pt"
    r = run_train([str(OFFICIAL_R20), str(r20)], script=("scripts/convert_official.py",), timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert load_checkpoint(r20)["classes"] == CIFAR10_CLASSES
    monkeypatch.setattr(eval_run, "evaluate", lambda *a, **k: pytest.fail("evaluated the wrong model"))
    cfg, args = _eval_cfg(r20, "model.layer=conv")
    with pytest.raises(ConfigError, match=r"r20.pt was trained as a different model: model.layer=conv \(trained as "
                                          r"model.layer=adder\)"):
        evaluate_checkpoint(cfg, args)


def test_resume_with_the_other_layer_is_refused_and_keeps_the_config(tmp_path):
    run = tmp_path / "run"
    train(compose(FAKE + ["trainer.epochs=1"]), str(run))
    before = (run / "config.yaml").read_text()
    with pytest.raises(ConfigError, match=r"last.pt was trained as a different model: model.layer=conv"):
        train(compose(FAKE + ["trainer.epochs=2", "model.layer=conv"]), str(run))
    assert (run / "config.yaml").read_text() == before


# --- 3. non-finite state is never saved; JSON never holds a bare NaN ---------------------------------------------

def test_diverged_first_epoch_saves_nothing_and_exits_3(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(NonFiniteLoss, match="non-finite .*no good checkpoint to resume from") as e:
        train(compose(FAKE + ["trainer.epochs=2", "optim.lr=1e8"]), str(run))
    assert e.value.exit_code == 3
    assert os.listdir(run / "checkpoints") == []
    assert not (run / "metrics.jsonl").exists() or (run / "metrics.jsonl").read_text() == ""


def test_non_finite_buffers_are_not_saved_and_last_good_is_named(tmp_path, monkeypatch):
    """Weights that turn inf while the loss stays finite (BN statistics) are caught before the epoch's save."""
    run = tmp_path / "run"
    train(compose(FAKE + ["trainer.epochs=1"]), str(run))
    last = run / "checkpoints" / "last.pt"
    before = last.read_bytes()
    from addernet.engine import fit

    real = fit.Run.end_epoch

    def poisoned(self, epoch, record):
        self.model.bn1.running_var.fill_(float("inf"))
        return real(self, epoch, record)

    monkeypatch.setattr(fit.Run, "end_epoch", poisoned)
    with pytest.raises(NonFiniteLoss, match=r"model.bn1.running_var .*last.pt still holds the last good state "
                                            r"\(epoch 1\)"):
        train(compose(FAKE + ["trainer.epochs=2"]), str(run))
    assert last.read_bytes() == before
    assert [r["epoch"] for r in map(_strict_json, (run / "metrics.jsonl").read_text().splitlines())] == [1]


def test_json_outputs_write_null_for_nan(tmp_path, capsys):
    assert _strict_json(json_line({"loss": float("nan"), "top1": 1.5, "x": [float("inf")]})) == \
        {"loss": None, "top1": 1.5, "x": [None]}
    out = tmp_path / "r.json"
    report({"top1": 10.0, "top5": 50.0, "loss": float("nan"), "n": 4, "images_per_s": 1.0}, str(out))
    assert _strict_json(capsys.readouterr().out.strip().splitlines()[-1])["loss"] is None
    assert _strict_json(out.read_text())["loss"] is None


# --- 4. resuming with more epochs recomputes the schedule ----------------------------------------------------------

def test_resume_with_more_epochs_continues_the_schedule_of_the_new_length(tmp_path):
    run = tmp_path / "run"
    train(compose(FAKE + ["trainer.epochs=2"]), str(run))
    train(compose(FAKE + ["trainer.epochs=3"]), str(run))
    lrs = [r["lr"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]
    cosine = [0.1 * (1 + math.cos(math.pi * e / 2)) / 2 for e in (0, 1)] + [0.1 * (1 + math.cos(math.pi * 2 / 3)) / 2]
    assert lrs == pytest.approx(cosine, abs=1e-12) and lrs[2] == pytest.approx(0.025)
    assert "trainer.epochs changed from 2 (the checkpoint's) to 3" in (run / "train.log").read_text()
    ckpt = load_checkpoint(run / "checkpoints" / "last.pt")
    assert ckpt["epoch"] == 3 and ckpt["config"]["trainer"]["epochs"] == 3
    assert OmegaConf.load(run / "config.yaml").trainer.epochs == 3


# --- 5. one run per run dir ---------------------------------------------------------------------------------------

def test_a_locked_run_dir_fails_at_once_and_is_left_alone(tmp_path):
    run = tmp_path / "run"
    holder = rundir.lock_run_dir(str(run))  # what a live run holds
    try:
        with pytest.raises(rundir.RunDirBusy, match=f"run dir {run} is in use by another training run \\(pid "
                                                    f"{os.getpid()}"):
            train(compose(FAKE + ["trainer.epochs=1"]), str(run))
        assert sorted(os.listdir(run)) == [".lock"]  # no train.log, config.yaml or checkpoints written
    finally:
        holder.close()
    train(compose(FAKE + ["trainer.epochs=1"]), str(run))  # released: the next run goes ahead


@pytest.mark.slow
def test_concurrent_train_py_in_one_run_dir(tmp_path):
    run = tmp_path / "run"
    args = FAKE + ["data.train_size=64", "data.batch_size=8", "trainer.epochs=3", f"hydra.run.dir={run}"]
    first = subprocess.Popen([sys.executable, "train.py", *args], cwd=REPO, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(run / "train.log", "epoch 1/3 step 1/8", first)
        first.send_signal(signal.SIGSTOP)  # frozen mid-run, lock held: the second run cannot win a race
        try:
            second = run_train(args, timeout=120)
        finally:
            first.send_signal(signal.SIGCONT)
        assert second.returncode == 2 and "is in use by another training run" in second.stderr, second.stderr
        assert "Traceback" not in second.stderr
        assert first.wait(timeout=300) == 0, first.stderr.read()[-2000:]
    finally:
        first.kill()
    assert [r["epoch"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())] == [1, 2, 3]


# --- 6. empty datasets --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("override, message", [
    ("data.train_size=0", "the fake train set is empty .*data.train_size"),
    ("data.val_size=0", "the fake val set is empty .*data.val_size"),
    ("data.train_size=1", "training set has 1 image.*fewer than 2 per process"),
])
def test_empty_datasets_are_errors(tmp_path, override, message):
    with pytest.raises(DataError, match=message):
        train(compose(FAKE + ["trainer.epochs=1", override]), str(tmp_path / "run"))
    assert not os.listdir(tmp_path / "run" / "checkpoints")


def test_image_folder_without_images_is_an_error(tmp_path):
    for c in CIFAR10_CLASSES[:4]:
        (tmp_path / "test" / c).mkdir(parents=True)
    with pytest.raises(DataError, match="not a usable ImageFolder tree|is empty"):
        build_dataset(compose(_folder(tmp_path)).data, "val")


# --- 7. / 8. SIGTERM to the process group and Ctrl-C: save mid-epoch, exit 128 + signal ---------------------------

def _wait_for(log, text, proc, timeout=240):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"run ended before {text!r}: {proc.stderr.read()[-2000:]}")
        if log.exists() and text in log.read_text():
            return
        time.sleep(0.02)
    raise AssertionError(f"{text!r} never appeared in {log}")


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_to_the_process_group_saves_mid_epoch(tmp_path, jpeg_cifar, sig, code):
    """What SLURM (SIGTERM) and a terminal's Ctrl-C (SIGINT) do: signal every process, DataLoader workers too."""
    run = tmp_path / "run"
    args = _folder(jpeg_cifar, "data.batch_size=4", "trainer.epochs=2", "data.num_workers=2", f"hydra.run.dir={run}")
    proc = subprocess.Popen([sys.executable, "train.py", *args], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _wait_for(run / "train.log", "epoch 1/2 step 3/12", proc)
        os.killpg(proc.pid, sig)
        assert proc.wait(timeout=120) == code
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    err = proc.stderr.read()
    assert "DataLoader worker" not in err and "Traceback" not in err, err[-3000:]
    ckpt = load_checkpoint(run / "checkpoints" / "last.pt")
    assert ckpt["epoch"] == 0 and ckpt["step"] >= 3
    assert f"stopped by {'SIGTERM' if code == 143 else 'SIGINT (Ctrl-C)'} at epoch 1 step" in err


def test_workers_ignore_stop_signals_and_keep_their_seeds(jpeg_cifar):
    class Probe(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            info = torch.utils.data.get_worker_info()
            return torch.tensor([int(signal.getsignal(signal.SIGTERM) == signal.SIG_IGN),
                                 int(signal.getsignal(signal.SIGINT) == signal.SIG_IGN), info.seed % 2**31])

    cfg = compose(FAKE + ["data.num_workers=1", "data.batch_size=4"]).data
    loader = build_loader(cfg, "val", Probe(), seed=5)
    base = torch.empty((), dtype=torch.int64).random_(generator=torch.Generator().manual_seed(5)).item()
    [batch] = list(loader)
    assert batch[:, 0].tolist() == [1] * 4 and batch[:, 1].tolist() == [1] * 4
    assert batch[0, 2].item() == base % 2**31  # worker 0's seed: base seed + 0, as without the init fn


def test_a_worker_iterator_alive_at_exit_does_not_hang_the_process():
    """An iterator that is never freed (a module global) keeps SIGTERM-ignoring workers to the end: the exit
    hook kills them, quietly, instead of multiprocessing waiting forever for them to take its SIGTERM."""
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO / "tests")!r})
        from helpers import compose
        from addernet.data import build_loader
        batches = iter(build_loader(compose({FAKE!r} + ["data.num_workers=1"]).data, "train"))
        next(batches)
        print("one batch")
    """)
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "one batch", r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "killed by signal" not in r.stderr, r.stderr[-2000:]


def test_second_ctrl_c_stops_at_once():
    flag = StopFlag()
    flag(signal.SIGINT, None)
    assert flag.requested and flag.error.exit_code == 130 and flag.name == "SIGINT (Ctrl-C)"
    with pytest.raises(KeyboardInterrupt):
        flag(signal.SIGINT, None)
    term = StopFlag()
    term(signal.SIGTERM, None)
    term(signal.SIGTERM, None)  # a repeated SIGTERM still waits for the save
    assert term.error.exit_code == 143


# --- 9. stale temporaries ------------------------------------------------------------------------------------------

def test_stale_tmp_files_are_removed_at_start(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    stale = [run / "checkpoints" / ".last.pt.k3j2.tmp", run / "metrics.jsonl.tmp"]
    for p in stale:
        p.write_bytes(b"half a write")
    train(compose(FAKE + ["trainer.epochs=1"]), str(run))
    assert not any(p.exists() for p in stale)
    assert sorted(os.listdir(run / "checkpoints")) == ["best.pt", "last.pt"]
    assert "removed 2 temporary file(s) of an interrupted write" in (run / "train.log").read_text()


# --- 10. corrupt images ----------------------------------------------------------------------------------------------

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
    cfg = compose(_folder(root, f"data.num_workers={workers}")).data
    with pytest.raises(DataError) as e:
        list(build_loader(cfg, "train"))
    msg = str(e.value)
    assert msg.startswith(f"cifar10_folder train set: cannot read image {bad}") and "\n" not in msg, msg
    assert "data.skip_corrupt=true" in msg


@pytest.mark.slow
def test_train_py_exits_after_a_worker_error(tmp_path, corrupt_folder):
    """The DataError from a worker leaves its iterator alive in the traceback; its workers ignore SIGTERM, so
    without addernet.data.loader.kill_workers_left_at_exit the process hung at exit (in multiprocessing's join)."""
    root, bad = corrupt_folder
    r = run_train(_folder(root, "data.num_workers=1", f"hydra.run.dir={tmp_path / 'run'}"), timeout=120)
    assert r.returncode == 2 and f"cannot read image {bad}" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr


def test_skip_corrupt_skips_and_reports_per_epoch(tmp_path, corrupt_folder):
    root, bad = corrupt_folder
    run = tmp_path / "run"
    train(compose(_folder(root, "data.skip_corrupt=true")), str(run))
    log = (run / "train.log").read_text()
    assert f"skipped unreadable image {bad}" in log
    assert "epoch 1: skipped 1 unreadable training and 0 validation image(s)" in log


# --- 11. batch size --------------------------------------------------------------------------------------------------

def test_batch_of_one_is_refused_with_a_valid_suggestion():
    with pytest.raises(ConfigError, match=r"data.batch_size must be an integer >= 2, got 1; e.g. data.batch_size=2"):
        check_config(compose(["data.batch_size=1"]))
    with pytest.raises(DataError, match="gives 1 sample per process .* use data.batch_size=4 or more"):
        build_loader(compose(FAKE + ["data.batch_size=2"]).data, "train", rank=0, world_size=2)
    loader = build_loader(compose(FAKE + ["data.train_size=17"]).data, "train")  # 16 + 1: the 1 is dropped
    assert [len(y) for _, y in loader] == [16]


# --- 12. disk full, unwritable places, bare tensors, input sizes ---------------------------------------------------

def _disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_disk_full_names_the_file_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    run = tmp_path / "run"
    train(compose(FAKE + ["trainer.epochs=1"]), str(run))
    last = run / "checkpoints" / "last.pt"
    before = last.read_bytes()
    monkeypatch.setattr(torch, "save", _disk_full)
    with pytest.raises(CheckpointError, match=f"cannot write checkpoint {run}/checkpoints/(best|last).pt: no space "
                                              f"left on device; the previous (best|last).pt is intact"):
        train(compose(FAKE + ["trainer.epochs=2"]), str(run))
    monkeypatch.undo()
    assert last.read_bytes() == before and sorted(os.listdir(last.parent)) == ["best.pt", "last.pt"]


def test_read_only_run_dir_is_one_message(tmp_path, monkeypatch):
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(rundir.os, "open", read_only)  # as root, chmod cannot make a dir read-only
    with pytest.raises(ConfigError, match=f"cannot write to the run dir {tmp_path} \\(Read-only file system\\); "
                                          f"make it writable or choose another one with hydra.run.dir="):
        train(compose(FAKE + ["trainer.epochs=1"]), str(tmp_path))


def test_unwritable_results_file_fails_before_evaluating(tmp_path, monkeypatch):
    monkeypatch.setattr(eval_run, "evaluate", lambda *a, **k: pytest.fail("evaluated before checking results_file"))
    path = tmp_path / "ckpt.pt"
    save_checkpoint({"format_version": 1, "model": build_model("lenet5_bn", "adder", in_channels=3).state_dict(),
                     "config": OmegaConf.to_container(compose(FAKE), resolve=True)}, path)
    (tmp_path / "a_file").write_text("x")
    for target, reason in ((tmp_path, "Is a directory"), (tmp_path / "a_file" / "r.json", "File exists|Not a directory")):
        cfg, args = _eval_cfg(path, f"results_file={target}")
        with pytest.raises(ConfigError, match=f"results_file={target} cannot be written \\(({reason})\\)"):
            evaluate_checkpoint(cfg, args)


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


def test_model_that_cannot_take_the_input_size_is_one_message():
    with pytest.raises(ConfigError, match=r"model=lenet5_bn cannot take 3x32x32 inputs \(data.image_size=32\).*"
                                          r"data.image_size=28"):
        check_config(compose(["model=lenet5_bn"]))


# --- 13. misleading messages; the error reaches train.log -------------------------------------------------------------

def test_failed_run_writes_its_error_to_train_log(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(DataError):
        train(compose(FAKE + ["trainer.epochs=1", "data.val_size=0"]), str(run))
    assert "[ERROR] run stopped: DataError: the fake val set is empty" in (run / "train.log").read_text()


# --- 14. unknown keys inside the known groups ---------------------------------------------------------------------------

def test_added_unknown_key_is_rejected_with_the_valid_ones(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key trainer.epoch \(did you mean trainer.epochs\?\).*Valid trainer "
                                          r"keys: (\w+, )*amp, .*epochs"):
        check_config(compose(["+trainer.epoch=1"]))
    with pytest.raises(ConfigError, match=r"unknown key data.val_dri \(did you mean data.val_dir\?\)"):
        evaluate_checkpoint(*_eval_cfg(tmp_path / "x.pt", "+data.val_dri=/x"))
    r = run_train(["+optim.lrr=0.1", f"hydra.run.dir={tmp_path / 'run'}"], timeout=120)
    assert r.returncode == 2 and "unknown key optim.lrr (did you mean optim.lr?)" in r.stderr
    assert "Traceback" not in r.stderr


# --- smaller frictions ----------------------------------------------------------------------------------------------------

def test_num_workers_auto_is_what_the_machine_has(monkeypatch):
    cfg = compose([]).data
    assert cfg.num_workers == "auto"
    cpus = len(os.sched_getaffinity(0))
    assert num_workers(cfg) == max(1, min(8, cpus))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(2 * cpus))  # more processes than CPUs on this machine
    assert num_workers(cfg) == 1
