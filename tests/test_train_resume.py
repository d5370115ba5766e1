"""Pre-emption and crashes: SIGTERM saves a usable mid-epoch last.pt and exits non-zero; SIGKILL at any
moment plus resume gives exactly the metrics and weights of an uninterrupted run (deterministic, CPU)."""

import os
import signal

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from addernet.checkpoint import load_checkpoint
from addernet.engine import train

from helpers import compose, metrics_without_timing
from helpers import signal_at as _signal_at
from helpers import start_train as _start

EPOCHS = 3


def _args(root, run=None):
    args = [
        "data=cifar10_folder",
        f"data.root={root}",
        "data.num_classes=4",
        "data.batch_size=4",
        "data.image_size=28",
        "model=lenet5_bn",
        "data.num_workers=1",
        "data.pin_memory=false",
        f"trainer.epochs={EPOCHS}",
        "trainer.deterministic=true",
        "trainer.progress=false",
        "trainer.log_every=1",
        "trainer.seed=3",
    ]
    return args + ([f"hydra.run.dir={run}"] if run else [])


@pytest.mark.slow
def test_sigterm_then_sigkill_then_resume_equals_uninterrupted(tmp_path, jpeg_cifar):
    reference = tmp_path / "reference"
    train(compose(_args(jpeg_cifar)), str(reference))  # uninterrupted, in this process

    run = tmp_path / "interrupted"
    log = run / "train.log"
    # 1. SIGTERM in epoch 2: the current step finishes, last.pt is written mid-epoch, exit code is non-zero.
    proc = _start(_args(jpeg_cifar, run))
    code = _signal_at(proc, log, f"epoch 2/{EPOCHS} step 2/12", signal.SIGTERM)
    assert code == 143, proc.stderr.read()[-2000:]
    ckpt = load_checkpoint(run / "checkpoints" / "last.pt")
    assert ckpt["epoch"] == 1 and ckpt["step"] >= 2 and len(ckpt["history"]) == 1

    # 2. Resume in the same run dir (automatic), then SIGKILL in epoch 3: no chance to save anything.
    proc = _start(_args(jpeg_cifar, run))
    assert _signal_at(proc, log, f"epoch 3/{EPOCHS} step 3/12", signal.SIGKILL) == -signal.SIGKILL
    assert load_checkpoint(run / "checkpoints" / "last.pt")["epoch"] == 2

    # 3. Resume again to the end.
    proc = _start(_args(jpeg_cifar, run))
    assert proc.wait(timeout=300) == 0, proc.stderr.read()[-2000:]
    text = log.read_text()
    assert text.count("resumed from") == 2
    assert f"1 epoch(s) done, {ckpt['step']} step(s) into the next" in text

    # determinism on one machine: runs made in this test, bit for bit
    expected = metrics_without_timing(reference / "metrics.jsonl")
    assert len(expected) == EPOCHS and metrics_without_timing(run / "metrics.jsonl") == expected
    ref_model = load_checkpoint(reference / "checkpoints" / "last.pt")["model"]
    got_model = load_checkpoint(run / "checkpoints" / "last.pt")["model"]
    assert all(torch.equal(ref_model[k], got_model[k]) for k in ref_model)
    assert sorted(os.listdir(run / "checkpoints")) == ["best.pt", "last.pt"]
    # TensorBoard: the replayed epoch's events were purged, so each epoch has exactly one point.
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    assert [(e.step, round(e.value, 4)) for e in events.Scalars("val/top1")] == [
        (r["epoch"], round(r["val_top1"], 4)) for r in expected
    ]
