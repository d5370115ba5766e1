"""Test helpers: tiny datasets written in real on-disk formats, config composition, train.py / torchrun runs,
signals at a known step, script loading, the shared data's paths.

Imported by the test modules (``from helpers import ...``); pytest fixtures live in conftest.py.
"""

import collections.abc
import copy
import functools
import hashlib
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_dir

from addernet.config import register

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
SHARED = REPO.parent / "shared"  # ../shared from the repository root; not part of a user's clone
CIFAR_SAMPLE = SHARED / "cifar10-test-sample"
OFFICIAL_R20 = SHARED / "official" / "ResNet20-AdderNet.pth"
OFFICIAL_LOGITS = SHARED / "official" / "ResNet20-AdderNet.cifar10-test-sample.jsonl"
CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]

# What every small run of the tests sets: images read in the main process (no worker processes, no pinned memory)
# and no progress bar.
QUIET = ["data.num_workers=0", "data.pin_memory=false", "trainer.progress=false"]
# The base of every tiny training run: LeNet-5-BN on 28x28 FakeData. Each test adds its sizes and options to it
# (the lists below and in the test modules name only what differs; a later model=... replaces the LeNet).
TINY_RUN = ["model=lenet5_bn", "data=fake", "data.image_size=28", *QUIET]
# 2 steps of 16 per epoch, a log line per step: the cfg_train fixture's run
FAKE = [*TINY_RUN, "data.train_size=32", "data.val_size=8", "data.batch_size=16", "trainer.log_every=1"]
# a log line per step, for small runs on other data (folder_run, CIFAR files)
FAST = [*QUIET, "trainer.log_every=1"]


# Float tolerances (the derivation is in tests/README.md). float32 rounds each operation to a relative u = 2**-24;
# a sum of n terms computed in any order (the order a CPU's SIMD width, oneDNN or its BLAS picks) is within
# n * u * sum|terms| of the exact sum (Higham, Accuracy and Stability of Numerical Algorithms, bound gamma_n).
U32 = 2.0**-24
# Pinned metrics of a tiny deterministic run, relative: the widest reduction of such a run (batch norm over 16 x 24 x
# 24 = 9,216 values) rounds by about sqrt(9216) * u = 6e-6 relative on average, different on each instruction set;
# 12 SGD steps amplify it about tenfold. 1e-4 is above that and far below what any change to the method moves.
PINNED_REL = 1e-4


def f32_sum_bound(abs_sum, n):
    """Largest error of a float32 sum of ``n`` terms whose absolute values sum to ``abs_sum``, in any order; doubled
    for the rounding of the terms themselves."""
    return 2 * n * U32 * abs_sum


def f32_ce_bound(logits):
    """Bound on the float32 error of a cross-entropy of ``logits`` (B x C): each log-probability is z - logsumexp(z),
    a sum of C exponentials rounded to about u of |z| + |logsumexp|, and the mean adds B terms."""
    z = logits.detach().double()
    return f32_sum_bound((z.abs().amax(1) + z.logsumexp(1).abs()).mean().item(), z.shape[1] + z.shape[0])


def assert_records_match(got, pinned, train_n, rel=PINNED_REL):
    """metrics.jsonl records equal to pinned ones from another CPU: float losses within ``rel``, epochs and learning
    rates exact (float64 from the schedule), accuracies within one image of the pinned count (``train_n`` training
    images an epoch, ``val_n`` validation): a prediction whose two competing logits are within rounding of each
    other goes either way on another CPU, and a barely trained network makes a few."""
    assert [sorted(r) for r in got] == [sorted(r) for r in pinned]
    for g, p in zip(got, pinned):
        exact = [k for k in p if "loss" not in k and "top" not in k]
        assert {k: g[k] for k in exact} == {k: p[k] for k in exact}
        for k in (k for k in p if "top" in k):
            n = train_n if k.startswith("train") else p["val_n"]
            assert round(abs(g[k] - p[k]) * n / 100) <= 1, (k, g[k], p[k])  # percentages of n images
        assert {k: v for k, v in g.items() if "loss" in k} == pytest.approx(
            {k: v for k, v in p.items() if "loss" in k}, rel=rel
        )


# what a finished train.py run leaves in its run dir (plus .hydra/ when launched through Hydra)
RUN_FILES = {"config.yaml", "train.log", "metrics.jsonl", "tensorboard", "checkpoints", ".lock", "run.json"}

# 2 steps of 8 per epoch on the CPU (trainer.epochs and the rest added by each test)
TINY_LENET = [*TINY_RUN, "data.train_size=16", "data.val_size=8", "data.batch_size=8", "trainer.device=cpu"]

# a one-block ViT of width 8 on 16x16 FakeData, CPU
TINY_VIT = [
    *TINY_RUN,
    "model=vit",
    "model.width=8",
    "model.depth=1",
    "model.heads=2",
    "data.image_size=16",
    "data.train_size=16",
    "data.val_size=8",
    "data.batch_size=8",
    "trainer.device=cpu",
]


def folder_run(root, *extra):
    """Overrides of a one-epoch LeNet-5-BN run on a small cifar10_folder tree (the jpeg_cifar fixture's 4 classes)."""
    return [
        "data=cifar10_folder",
        f"data.root={root}",
        "data.num_classes=4",
        "data.batch_size=16",
        "model=lenet5_bn",
        "data.image_size=28",
        "trainer.epochs=1",
        *FAST,
        *extra,
    ]


def needs_shared(*paths):
    """A skipif mark for tests that read ``paths`` (relative to ../shared), with the missing ones as the reason."""
    missing = [str(SHARED / p) for p in paths if not (SHARED / p).exists()]
    return pytest.mark.skipif(
        bool(missing),
        reason=f"shared data absent ({', '.join(missing)}): ../shared next to "
        "the repository is not part of a user's clone",
    )


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _md5(path):
    return hashlib.md5(Path(path).read_bytes()).hexdigest()


def write_cifar10(root, n_train=40, n_test=37, seed=0):
    """Write a tiny CIFAR-10 in the real python format (root/cifar-10-batches-py, pickled dicts).

    Returns {"train": (uint8 images N x 32 x 32 x 3, labels), "test": (...), "md5": {filename: md5}};
    the training images are split over data_batch_1..5 like the real dataset.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    folder = Path(root) / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    out, md5 = {}, {}
    for split, n in (("train", n_train), ("test", n_test)):
        images = rng.integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)
        labels = [int(x) for x in rng.integers(0, 10, size=n)]
        out[split] = (images, labels)
        flat = images.transpose(0, 3, 1, 2).reshape(n, 3072)  # CIFAR rows: R plane, G plane, B plane
        parts = np.array_split(np.arange(n), 5) if split == "train" else [np.arange(n)]
        for i, idx in enumerate(parts):
            name = f"data_batch_{i + 1}" if split == "train" else "test_batch"
            entry = {
                "batch_label": name,
                "labels": [labels[j] for j in idx],
                "data": flat[idx],
                "filenames": [f"{j}.png" for j in idx],
            }
            (folder / name).write_bytes(pickle.dumps(entry, protocol=2))
            md5[name] = _md5(folder / name)
    (folder / "batches.meta").write_bytes(
        pickle.dumps({"label_names": CIFAR10_CLASSES, "num_vis": 3072, "num_cases_per_batch": 10000}, protocol=2)
    )
    md5["batches.meta"] = _md5(folder / "batches.meta")
    out["md5"] = md5
    return out


def write_mnist(root, n_train=40, n_test=21, seed=0):
    """Write a tiny MNIST in the real idx format (root/MNIST/raw/*-ubyte, uncompressed, as torchvision reads it).

    Returns {"train": (uint8 images N x 28 x 28, labels), "test": (...)}.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    raw = Path(root) / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    out = {}
    for split, prefix, n in (("train", "train", n_train), ("test", "t10k", n_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, size=n).astype(np.uint8)
        # idx: magic (0, 0, dtype 0x08 = ubyte, number of dimensions), then big-endian int32 sizes, then the data
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(
            bytes([0, 0, 8, 3]) + np.array([n, 28, 28], dtype=">i4").tobytes() + images.tobytes()
        )
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(
            bytes([0, 0, 8, 1]) + np.array([n], dtype=">i4").tobytes() + labels.tobytes()
        )
        out[split] = (images, [int(x) for x in labels])
    return out


def trust_cifar10_md5(monkeypatch, md5):
    """Make torchvision's CIFAR10 integrity check accept the files written by write_cifar10 (this process only).

    torchvision compares every file with the md5 of the real release; the test supplies the checksums of
    the files it wrote instead, so the real check stays in force for real data.
    """
    from torchvision.datasets import CIFAR10

    monkeypatch.setattr(CIFAR10, "train_list", [[f"data_batch_{i}", md5[f"data_batch_{i}"]] for i in range(1, 6)])
    monkeypatch.setattr(CIFAR10, "test_list", [["test_batch", md5["test_batch"]]])
    monkeypatch.setattr(CIFAR10, "meta", {**CIFAR10.meta, "md5": md5["batches.meta"]})


def write_jpeg_folder(root, n_per_class, classes=CIFAR10_CLASSES[:4], size=32, seed=0):
    """An ImageFolder tree root/<class>/<i>.jpg of random-colour JPEGs; returns the number of images."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c in classes:
        (Path(root) / c).mkdir(parents=True, exist_ok=True)
        for i in range(n_per_class):
            Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(Path(root) / c / f"{i}.jpg")
    return n_per_class * len(classes)


class SigtermOn(logging.Handler):
    """Sends this process SIGTERM when a log message contains ``text`` (a pre-emption at a known step).

    Add it to the ``addernet.train`` logger; the trainer's own SIGTERM path then runs at that step.
    """

    def __init__(self, text):
        super().__init__()
        self.text = text

    def emit(self, record):
        if self.text in record.getMessage():
            os.kill(os.getpid(), signal.SIGTERM)


@functools.cache
def _composed(overrides, config_name):
    register()  # the schemas the YAML files extend
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return hydra_compose(config_name=config_name, overrides=list(overrides))


def compose(overrides=(), config_name="train"):
    """Compose configs/<config_name>.yaml (train.yaml, test.yaml) with ``overrides`` through Hydra's compose API.

    Each distinct composition runs once per pytest run; every call returns its own copy."""
    return copy.deepcopy(_composed(tuple(overrides), config_name))


def child_env(**extra):
    """Environment of a child process: one intra-op thread, the repo and tests/ importable, unbuffered output."""
    path = os.pathsep.join(p for p in (str(REPO), str(TESTS), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", **extra}


class _GuardedEnviron(collections.abc.MutableMapping):
    """os.environ, except that setting or deleting ``name`` fails the test."""

    def __init__(self, environ, name):
        self.environ, self.name = environ, name

    def _check(self, key):
        if key == self.name:
            raise AssertionError(f"the package wrote the environment variable {key}")

    def __getitem__(self, key):
        return self.environ[key]

    def __setitem__(self, key, value):
        self._check(key)
        self.environ[key] = value

    def __delitem__(self, key):
        self._check(key)
        del self.environ[key]

    def __iter__(self):
        return iter(self.environ)

    def __len__(self):
        return len(self.environ)

    def copy(self):
        return dict(self.environ)


def forbid_env_writes(monkeypatch, name):
    """Fail the test if anything in this process sets or deletes os.environ[name] (until the test ends)."""
    monkeypatch.setattr(os, "environ", _GuardedEnviron(os.environ, name))


def torchrun(args, nproc=2, timeout=300, env=None):
    """``python -m torch.distributed.run --nproc_per_node=nproc args...`` on one node (gloo on CPU, a free port,
    one thread per process) from the repo root; returns CompletedProcess (text). ``args``: a script and its args."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        f"--nproc_per_node={nproc}",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        *map(str, args),
    ]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=child_env(**(env or {})))


def run_train(args, timeout=300, env=None, script=("train.py",), **popen):
    """Run ``python train.py args...`` from the repo root; returns CompletedProcess (text)."""
    cmd = [sys.executable, *script] if script[0].endswith(".py") else list(script)
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        cmd + list(args), cwd=REPO, capture_output=True, text=True, timeout=timeout, env=full_env, **popen
    )


def run_main(main, prog, args):
    """Run an entry point's ``main()`` in this process as ``python <prog> args...`` runs it in a new one (which
    costs seconds of interpreter, torch and Hydra start): returns CompletedProcess (text) with its exit code,
    stdout and stderr, where stderr ends with the warnings it raised as a new interpreter would print them. An
    uncaught exception propagates (a new process would print its traceback)."""
    import contextlib
    import io
    import warnings

    out, err, argv, full_error = io.StringIO(), io.StringIO(), sys.argv, os.environ.get("HYDRA_FULL_ERROR")
    sys.argv, code = [prog, *map(str, args)], 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("default")
                for hidden in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
                    warnings.simplefilter("ignore", hidden)  # hidden by a new interpreter's default filters
                try:
                    main()
                except SystemExit as e:
                    code = e.code if isinstance(e.code, int) else int(e.code is not None)
    finally:
        sys.argv = argv
        if full_error is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)  # set by the entry handler for its own process
        else:
            os.environ["HYDRA_FULL_ERROR"] = full_error
    shown = "".join(warnings.formatwarning(w.message, w.category, w.filename, w.lineno) for w in caught)
    return subprocess.CompletedProcess([prog, *map(str, args)], code, out.getvalue(), err.getvalue() + shown)


def run_script(script, args):
    """Run the script file ``script`` (relative to the repository) in this process through run_main, as
    ``python script args...`` runs it, its own ``if __name__ == "__main__"`` block included."""
    import runpy

    return run_main(lambda: runpy.run_path(str(REPO / script), run_name="__main__"), Path(script).name, args)


def run_entry(script, args):
    """Run the entry point ``script`` (train.py, test.py, scripts/quantize.py, scripts/export_onnx.py) in this process
    through run_main, as ``python script args...`` runs it."""
    from addernet.test import main as test_main
    from addernet.tools import export_onnx, quantize
    from addernet.train import main as train_main

    mains = {
        "train.py": train_main,
        "test.py": test_main,
        "scripts/quantize.py": quantize.cli,
        "scripts/export_onnx.py": export_onnx.cli,
    }
    return run_main(mains[script], script.rpartition("/")[2], args)


def metrics_without_timing(path):
    """metrics.jsonl records with the wall-clock fields removed (those legitimately differ run to run)."""
    import json

    timing = {"epoch_seconds", "images_per_s", "val_images_per_s", "precise_bn_seconds"}
    return [
        {k: v for k, v in json.loads(line).items() if k not in timing} for line in Path(path).read_text().splitlines()
    ]


def start_train(args, env=None, **popen):
    """Start ``python train.py args...`` in the background (stdout discarded, stderr kept); ``env`` is added to
    this process's environment, ``popen`` goes to Popen (start_new_session=True: a process group to signal)."""
    return subprocess.Popen(
        [sys.executable, "train.py", *args],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        **popen,
    )


def wait_for_log(proc, log, text, timeout=240):
    """Return as soon as ``text`` shows up in the file ``log`` of the running ``proc``; fail if it ends first."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"run ended before {text!r}: {proc.stderr.read()[-2000:]}")
        if log.exists() and text in log.read_text():
            return
        time.sleep(0.02)
    proc.kill()
    raise AssertionError(f"{text!r} never appeared in {log}")


def signal_at(proc, log, line, sig, timeout=240):
    """Send ``sig`` to ``proc`` as soon as ``line`` shows up in the run's train.log (i.e. mid-epoch); its exit code."""
    wait_for_log(proc, log, line, timeout)
    proc.send_signal(sig)
    return proc.wait(timeout=120)


def preempt_at(args, at, run):
    """Train ``args`` in this process into ``run`` until its log reads ``at``, where a SIGTERM stops it (Preempted)."""
    from addernet.engine import train
    from addernet.errors import Preempted

    trigger = SigtermOn(at)
    logging.getLogger("addernet.train").addHandler(trigger)
    try:
        with pytest.raises(Preempted):
            train(compose(args), str(run))
    finally:
        logging.getLogger("addernet.train").removeHandler(trigger)


def assert_exact_resume(args, at, root, kill_at=None, parts=("model",)):
    """Determinism on one machine: the run ``args`` trained uninterrupted (in this process) into root/reference, and
    into root/interrupted stopped by SIGTERM when its train.log reads ``at``, then (``kill_at``) resumed and killed
    by SIGKILL there, then resumed to the end, give bit-identical metrics and last.pt ``parts`` ("model", "ema",
    "task"). Without ``kill_at`` the stop is in this process (helpers.SigtermOn), with it train.py processes.
    Returns the (reference, interrupted) last.pt checkpoints."""
    import torch

    from addernet.checkpoint import load_checkpoint
    from addernet.engine import train

    reference, run = Path(root) / "reference", Path(root) / "interrupted"
    train(compose(args), str(reference))
    if kill_at is None:
        preempt_at(args, at, run)
        assert load_checkpoint(run / "checkpoints" / "last.pt")["step"] >= 1  # saved mid-epoch
        train(compose(args), str(run))
    else:
        command = [*args, f"hydra.run.dir={run}"]
        proc = start_train(command)
        assert signal_at(proc, run / "train.log", at, signal.SIGTERM) == 143, proc.stderr.read()[-2000:]
        assert load_checkpoint(run / "checkpoints" / "last.pt")["step"] >= 1  # saved mid-epoch
        proc = start_train(command)
        assert signal_at(proc, run / "train.log", kill_at, signal.SIGKILL) == -signal.SIGKILL
        proc = start_train(command)
        assert proc.wait(timeout=300) == 0, proc.stderr.read()[-2000:]
        assert (run / "train.log").read_text().count("resumed from") == 2
    assert metrics_without_timing(run / "metrics.jsonl") == metrics_without_timing(reference / "metrics.jsonl")
    ref, got = (load_checkpoint(r / "checkpoints" / "last.pt") for r in (reference, run))
    for part in parts:
        if part == "task":
            assert set(ref["task"]) == set(got["task"])
            states = [(f"task.{k}", ref["task"][k], got["task"][k]) for k in ref["task"]]
        else:
            states = [(part, ref[part], got[part])]
        for name, want, have in states:
            assert set(want) == set(have) and all(torch.equal(want[k], have[k]) for k in want), name
    return ref, got


# ---------------------------------------------------------------- test-only training tasks (task.name=helpers.X)
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from addernet.tasks import ClassificationTask  # noqa: E402


class L2PenaltyTask(ClassificationTask):
    """Cross-entropy plus ``task.weight`` * (sum of squared model weights), reported as parts ``ce`` and ``l2``."""

    config_keys = ("weight",)

    def forward(self, images, target):
        out = super().forward(images, target)
        l2 = sum((p.float() ** 2).sum() for p in self.model.parameters())
        weight = float(self.cfg.get("weight", 1e-3))
        return {
            "loss": out["loss"] + weight * l2,
            "output": out["output"],
            "ce": out["loss"].detach(),
            "l2": (weight * l2).detach(),
        }


class AuxHeadTask(ClassificationTask):
    """Cross-entropy plus a trained auxiliary linear head on the logits: a task that owns a trainable module."""

    trainable = ("head",)

    def __init__(self, model, cfg, student):
        super().__init__(model, cfg, student)
        classes = student.num_classes
        torch.manual_seed(1234)
        self.head = torch.nn.Linear(classes, classes)

    def forward(self, images, target):
        out = super().forward(images, target)
        aux = torch.nn.functional.cross_entropy(self.extra_net("head")(out["output"]), target)
        return {"loss": out["loss"] + aux, "output": out["output"], "aux": aux.detach()}


class SlowStepTask(ClassificationTask):
    """Classification with slow or stalling training steps (pre-emption and stalled-rank tests).

    ``task.delay``: extra seconds per step; ``task.sigterm_step``: rank 0 sends itself SIGTERM during that step
    (1-based, counted over the run); ``task.stall_rank`` / ``task.stall_step`` / ``task.stall_seconds``:
    that rank sleeps that long in that step (a hung process under torchrun).
    """

    config_keys = ("delay", "sigterm_step", "stall_rank", "stall_step", "stall_seconds")
    steps = 0

    def forward(self, images, target):
        SlowStepTask.steps += 1
        cfg = self.cfg
        rank = int(os.environ.get("RANK", "0"))
        if SlowStepTask.steps == cfg.get("sigterm_step") and rank == 0:
            os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(float(cfg.get("delay", 0.0)))
        if SlowStepTask.steps == cfg.get("stall_step") and rank == cfg.get("stall_rank"):
            time.sleep(float(cfg.get("stall_seconds", 0.0)))
        return super().forward(images, target)


# ---------------------------------------------------------------- task=kd: a frozen CNN teacher on the tiny run

# the tiny run in 3 steps of 8 an epoch, 10 validation images, 2 epochs, on the CPU
KD_RUN = [
    *FAKE,
    "data.train_size=24",
    "data.val_size=10",
    "data.batch_size=8",
    "trainer.epochs=2",
    "trainer.device=cpu",
]


def conv_teacher_file(tmp_path, num_classes=10, seed=5):
    """A LeNet-5-BN CNN as a bare state_dict (its BN statistics made non-trivial) and the module itself."""
    from addernet.models import model_from_config

    torch.manual_seed(seed)
    teacher = model_from_config(compose(KD_RUN + ["model.layer=conv", f"data.num_classes={num_classes}"]))
    for m in teacher.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 2.0)
    path = tmp_path / "teacher.pt"
    torch.save(teacher.state_dict(), path)
    return path, teacher.eval()


def kd_cfg(path, *extra):
    """KD_RUN with task=kd and the CNN teacher state_dict at ``path``."""
    return compose(KD_RUN + ["task=kd", f"task.teacher={path}", "task.teacher_layer=conv", *extra])


# ---------------------------------------------------------------- a small float64 adder net (DDP and step tests)


class SmallAdderNet(nn.Module):
    """Conv stem, one adder layer used twice (shared weight), a strided adder layer, linear head over 5 classes.
    GroupNorm (per sample) instead of BatchNorm, so the split of a batch cannot change the maths."""

    def __init__(self):
        from addernet import Adder2d

        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.shared = Adder2d(4, 4, 3, padding=1)
        self.down = Adder2d(4, 6, 3, stride=2, padding=1)
        self.norms = nn.ModuleList(nn.GroupNorm(1, c) for c in (4, 4, 6))
        self.fc = nn.Linear(6, 5)

    def forward(self, x):
        x = self.stem(x)
        x = self.norms[0](self.shared(x))
        x = self.norms[1](self.shared(x))
        x = F.relu(self.norms[2](self.down(x)))
        return self.fc(x.mean((2, 3)))


def small_adder_net():
    """SmallAdderNet in float64, its weights drawn from seed 0 (the same in every process)."""
    torch.manual_seed(0)
    return SmallAdderNet().double()


def small_batches(n, steps=2, seed=3):
    """``steps`` batches of ``n`` float64 3x8x8 images with labels in 0..4, for SmallAdderNet (the defaults: the
    step tests' batches, also ddp_options_worker.py's)."""
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(n, 3, 8, 8, generator=g, dtype=torch.float64), torch.randint(0, 5, (n,), generator=g))
        for _ in range(steps)
    ]


def adaptive_lr_batches():
    """3 batches of 8 (seed 1): what ddp_adaptive_lr_worker.py trains on, each split over the ranks."""
    return small_batches(8, 3, seed=1)


def sgd_with_adaptive_lr(model, batches, eta=0.2):
    """A plain loop: zero_grad, mean cross-entropy, backward, step, with AdaptiveLR hooked into the step; returns
    the AdaptiveLR."""
    from addernet import AdaptiveLR

    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    adaptive = AdaptiveLR(model, eta).attach(opt)
    for x, y in batches:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return adaptive


# ---------------------------------------------------------------- quantisation: references and a quantised ResNet-20


def quant_cfg(**values):
    """The quant group as test.py composes it (a plain config), with ``values`` in place of its defaults."""
    return OmegaConf.merge(OmegaConf.create(OmegaConf.to_container(compose(config_name="test").quant)), values)


def int_reference(x, w, stride, padding, dilation, groups):
    """sum |x - w| in int64 from unfold: the plain integer reference of the kernel."""
    n, o = x.shape[0], w.shape[0]
    cols = F.unfold(x.double(), w.shape[-2:], dilation=dilation, padding=padding, stride=stride).to(torch.int64)
    cols = cols.view(n, groups, -1, cols.shape[-1])
    wk = w.to(torch.int64).reshape(groups, o // groups, -1)
    y = (cols.unsqueeze(2) - wk[None, :, :, :, None]).abs().sum(3)
    ho = (x.shape[2] + 2 * padding[0] - dilation[0] * (w.shape[2] - 1) - 1) // stride[0] + 1
    wo = (x.shape[3] + 2 * padding[1] - dilation[1] * (w.shape[3] - 1) - 1) // stride[1] + 1
    return y.reshape(n, o, ho, wo)


def random_images(n, seed):
    """``n`` standard-normal 3x32x32 images from ``seed``."""
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


@functools.cache  # built once per bit width and process, for tests that only read it
@torch.no_grad()
def quantised_resnet20(bits, grid="unsigned", groups=4):
    """A ResNet-20 with BatchNorm statistics from its own activations, filters spread over a wide range of
    max|w| (so groups get different scales), quantised on 16 images (one calibration batch)."""
    from addernet.models import build_model
    from addernet.ops import Adder2d
    from addernet.quant import quantize_model

    torch.manual_seed(0)
    model = build_model("resnet20")
    for m in model.modules():
        if isinstance(m, Adder2d):
            m.weight.mul_(torch.linspace(0.01, 1.0, m.out_channels).view(-1, 1, 1, 1))
        elif isinstance(m, torch.nn.BatchNorm2d):
            m.momentum = None
    model.train()
    model(random_images(32, 0))
    model.eval()
    images = torch.utils.data.TensorDataset(random_images(16, 1), torch.zeros(16))
    return quantize_model(
        model,
        torch.utils.data.DataLoader(images, batch_size=16),
        quant_cfg(bits=bits, groups=groups, weight_grid=grid),
    )


def _bn64(bn, y):
    k = bn.weight.double() / (bn.running_var.double() + bn.eps).sqrt()
    return y * k.view(1, -1, 1, 1) + (bn.bias.double() - bn.running_mean.double() * k).view(1, -1, 1, 1)


def _qlayer64(q, x):
    """-(s_o/(2^b-1)) sum|q_a - v| + beta per filter, q_a = clip(round(x (2^b-1)/s_o)), v = weight_step * q_w (2 q_w on
    the signed grid, q_w on the unsigned one), in float64."""
    from addernet.quant.quantizer import levels

    lv, s = levels(int(q.bits)), q.scale[q.group].double()
    ho = (x.shape[2] + 2 * q.padding[0] - q.kernel_size[0]) // q.stride[0] + 1
    y = torch.empty(x.shape[0], ho * ho, q.out_channels, dtype=torch.float64)
    for scale in set(s.tolist()):
        members = (s == scale).nonzero().flatten()
        a = (x * (lv / scale)).round().clamp(0, lv)
        cols = F.unfold(a, q.kernel_size, padding=q.padding, stride=q.stride).transpose(1, 2)
        w = int(q.weight_step) * q.qweight[members].double().flatten(1)
        y[:, :, members] = -(scale / lv) * torch.cdist(cols, w.expand(x.shape[0], -1, -1), p=1)
    return (y + q.bias_term.double()).transpose(1, 2).reshape(x.shape[0], q.out_channels, ho, -1)


def _f32(t):
    return t.float().double()


@torch.no_grad()
def quantised_reference(model, x):
    """The quantised ResNet ``model`` in float64, with float32 where the integer network keeps a float copy (the
    stem convolution's output, the residual operands, the tail)."""
    h = F.relu(_bn64(model.bn1, model.conv1(x).double()))
    for stage in (model.layer1, model.layer2, model.layer3):
        for b in stage:
            ident = _f32(h) if b.downsample is None else _f32(_bn64(b.downsample[1], _qlayer64(b.downsample[0], h)))
            mid = F.relu(_bn64(b.bn1, _qlayer64(b.conv1, h)))
            h = F.relu(_bn64(b.bn2, _qlayer64(b.conv2, mid)) + ident)
    return _bn64(model.bn2, F.conv2d(F.avg_pool2d(_f32(h), 8), model.fc.weight.double())).flatten(1)


def max_rel_error(a, b):
    """The largest error of ``a`` against ``b`` over a batch, relative to each row's largest |b|."""
    return ((a.double() - b.double()).abs().max(1).values / b.double().abs().max(1).values).max().item()
