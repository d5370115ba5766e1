"""Numerics that AMP and bad weights cannot break (docs/reliability.md, "Mixed precision" and "NaN / inf"):
AdderNet accuracy under each trainer.amp mode against float32, non-finite state never saved, checkpoints with
NaN/inf weights refused, JSON outputs without bare NaN, config values that would fail inside torch caught by
the checks.
"""

import json
import os

import pytest
import torch
from torchvision import datasets, transforms

from addernet.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from addernet.checkpoint.official import load_official
from addernet.engine import ConfigError, NonFiniteLoss, check_config, evaluate, train
from addernet.engine.evaluation import evaluate_checkpoint, report
from addernet.engine.outputs import json_line
from addernet.forward import logits_and_loss
from addernet.models import build_model

from helpers import CIFAR_SAMPLE, FAKE, OFFICIAL_R20, compose


@pytest.fixture(scope="module")
def official_on_sample():
    """The official ResNet-20, every 5th image of the shared CIFAR-10 sample (200 images, 20 per class), and the
    float32 (trainer.amp=off) predictions and top-1 on them."""
    if not (OFFICIAL_R20.is_file() and CIFAR_SAMPLE.is_dir()):
        pytest.skip(f"{OFFICIAL_R20} or {CIFAR_SAMPLE} absent: ../shared is not part of a user's clone")
    model = build_model("resnet20", "adder", num_classes=10, in_channels=3)
    load_official(model, load_checkpoint(OFFICIAL_R20), source=str(OFFICIAL_R20))
    tf = transforms.Compose(
        [transforms.ToTensor(), transforms.Normalize((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010))]
    )
    sample = torch.utils.data.Subset(datasets.ImageFolder(str(CIFAR_SAMPLE), tf), range(0, 1000, 5))
    model, loader = model.eval(), torch.utils.data.DataLoader(sample, batch_size=100)
    return model, loader, _predictions(model, loader, "off"), evaluate(model, loader, "cpu", amp="off")["top1"]


def _predictions(model, loader, amp):
    with torch.no_grad():
        return torch.cat([logits_and_loss(model, x, y, amp)[0].argmax(1) for x, y in loader])


@pytest.mark.slow  # 1,200 ResNet-20 image evaluations
@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_official_resnet20_keeps_its_float32_accuracy_under_amp(official_on_sample, amp):
    """Adder outputs (~1e4) minus BatchNorm's mean of the same size: rounded to bf16 they become noise
    (40% instead of 81% on this sample); the adder layers and their BatchNorm run in float32 under autocast."""
    model, loader, reference, top1_off = official_on_sample
    got = _predictions(model, loader, amp)
    assert (got == reference).float().mean() >= 0.97
    top1 = evaluate(model, loader, "cpu", amp=amp)["top1"]
    assert abs(top1 - top1_off) <= 1.5, (top1, top1_off)


def test_checkpoint_with_nan_weights_is_refused_naming_the_tensors(tmp_path, finished_tiny_run):
    run = finished_tiny_run
    ckpt = load_checkpoint(run / "checkpoints" / "best.pt")
    ckpt["model"]["conv1.weight"][0, 0, 0, 0] = float("nan")
    ckpt["model"]["bn1.running_var"][1] = float("inf")
    bad = tmp_path / "bad.pt"
    save_checkpoint(ckpt, bad)
    args = [f"checkpoint={bad}", "trainer.progress=false"]
    with pytest.raises(
        CheckpointError,
        match=r"NaN/inf values in 2 tensor\(s\): (conv1.weight, bn1.running_var|"
        r"bn1.running_var, conv1.weight)",
    ):
        evaluate_checkpoint(compose(args, config_name="test"), args)
    # resuming it: the same refusal, with the advice for a diverged run
    with pytest.raises(CheckpointError, match=r"NaN/inf .*lower optim.lr"):
        train(compose(FAKE + ["trainer.epochs=2", f"trainer.resume={bad}"]), str(tmp_path / "resumed"))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["optim.nesterov=true", "optim.momentum=0"], r"optim.nesterov=true needs optim.momentum > 0"),
        (["sched=cosine_warmup", "sched.warmup_epochs=5", "trainer.epochs=5"], r"warmup_epochs=5 must be below"),
        (["sched=cosine_warmup", "sched.warmup_start=2"], r"sched.warmup_start=2.0 must be in \(0, 1\]"),
        (["data.std=[0.5,0,0.5]"], r"data.std=\[0.5, 0.0, 0.5\] must hold finite numbers > 0"),
        (["trainer.seed=18446744073709551616"], r"trainer.seed=18446744073709551616 is too large"),
    ],
)
def test_values_that_would_fail_inside_torch_are_caught_by_the_checks(overrides, message):
    # the schema types the values (2 -> 2.0); a value of the wrong type is Hydra's to refuse (tests/test_schema.py)
    with pytest.raises(ConfigError, match=message) as e:
        check_config(compose(FAKE + overrides))
    assert "\n" not in str(e.value)


def test_the_largest_allowed_seed_runs(cfg_train, tiny_run):
    """The bound of the seed check is a real limit: 2**32 - 1 trains (seed + rank, seed + epoch fit 64 bits)."""
    cfg_train.trainer.epochs, cfg_train.trainer.seed = 1, 2**32 - 1
    tiny_run()


def _strict_json(text):
    """json.loads that fails on NaN / Infinity (Python's json accepts them by default)."""
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in JSON: {text}"))


# --- non-finite state is never saved; JSON never holds a bare NaN ---------------------------------------------------


def test_diverged_first_epoch_saves_nothing_and_exits_3(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(NonFiniteLoss, match="non-finite .*no good checkpoint to resume from") as e:
        train(compose(FAKE + ["trainer.epochs=2", "optim.lr=1e8"]), str(run))
    assert e.value.exit_code == 3
    assert os.listdir(run / "checkpoints") == []
    assert not (run / "metrics.jsonl").exists() or (run / "metrics.jsonl").read_text() == ""


def test_non_finite_buffers_are_not_saved_and_last_good_is_named(cfg_train, tiny_run, monkeypatch):
    """Weights that turn inf while the loss stays finite (BN statistics) are caught before the epoch's save."""
    cfg_train.trainer.epochs = 1
    run = tiny_run()
    last = run / "checkpoints" / "last.pt"
    before = last.read_bytes()
    from addernet.engine import fit

    real = fit.Run.end_epoch

    def poisoned(self, epoch, record):
        self.parts.model.bn1.running_var.fill_(float("inf"))
        return real(self, epoch, record)

    monkeypatch.setattr(fit.Run, "end_epoch", poisoned)
    with pytest.raises(
        NonFiniteLoss,
        match=r"model.bn1.running_var .*last.pt still holds the last good state "
        r"\(epoch 1\)",
    ):
        train(compose(FAKE + ["trainer.epochs=2"]), str(run))
    assert last.read_bytes() == before
    assert [r["epoch"] for r in map(_strict_json, (run / "metrics.jsonl").read_text().splitlines())] == [1]


def test_json_outputs_write_null_for_nan(tmp_path, capsys):
    assert _strict_json(json_line({"loss": float("nan"), "top1": 1.5, "x": [float("inf")]})) == {
        "loss": None,
        "top1": 1.5,
        "x": [None],
    }
    out = tmp_path / "r.json"
    report({"top1": 10.0, "top5": 50.0, "loss": float("nan"), "n": 4, "images_per_s": 1.0}, str(out))
    assert _strict_json(capsys.readouterr().out.strip().splitlines()[-1])["loss"] is None
    assert _strict_json(out.read_text())["loss"] is None
