"""Numerics that AMP and bad weights cannot break (docs/reliability.md, "Mixed precision" and "NaN / inf"):
AdderNet accuracy under each trainer.amp mode against float32, checkpoints with NaN/inf weights refused,
config values that would fail inside torch caught by the checks.
"""
import pytest
import torch
from torchvision import datasets, transforms

from addernet.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from addernet.checkpoint.official import load_official
from addernet.engine import ConfigError, check_config, evaluate, train
from addernet.engine.eval_run import evaluate_checkpoint
from addernet.models import build_model
from helpers import CIFAR_SAMPLE, SHARED, compose

OFFICIAL_R20 = SHARED / "official" / "ResNet20-AdderNet.pth"
FAKE = ["data=fake", "data.train_size=32", "data.val_size=8", "data.batch_size=16", "model=lenet5_bn",
        "data.image_size=28", "trainer.progress=false", "data.num_workers=0", "data.pin_memory=false",
        "trainer.log_every=1"]


@pytest.fixture(scope="module")
def official_on_sample():
    """The official ResNet-20 and every 5th image of the shared CIFAR-10 sample (200 images, 20 per class)."""
    if not (OFFICIAL_R20.is_file() and CIFAR_SAMPLE.is_dir()):
        pytest.skip(f"shared data not in {SHARED}")
    model = build_model("resnet20", "adder", num_classes=10, in_channels=3)
    load_official(model, load_checkpoint(OFFICIAL_R20), source=str(OFFICIAL_R20))
    tf = transforms.Compose([transforms.ToTensor(),
                             transforms.Normalize((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010))])
    sample = torch.utils.data.Subset(datasets.ImageFolder(str(CIFAR_SAMPLE), tf), range(0, 1000, 5))
    return model.eval(), torch.utils.data.DataLoader(sample, batch_size=100)


def _predictions(model, loader, amp):
    from addernet.forward import logits_and_loss

    with torch.no_grad():
        return torch.cat([logits_and_loss(model, x, y, amp)[0].argmax(1) for x, y in loader])


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_official_resnet20_keeps_its_float32_accuracy_under_amp(official_on_sample, amp):
    """Adder outputs (~1e4) minus BatchNorm's mean of the same size: rounded to bf16 they become noise
    (40% instead of 81% on this sample); the adder layers and their BatchNorm run in float32 under autocast."""
    model, loader = official_on_sample
    reference = _predictions(model, loader, "off")
    got = _predictions(model, loader, amp)
    assert (got == reference).float().mean() >= 0.97
    top1 = {a: evaluate(model, loader, "cpu", amp=a)["top1"] for a in ("off", amp)}
    assert abs(top1[amp] - top1["off"]) <= 1.5, top1


def test_checkpoint_with_nan_weights_is_refused_naming_the_tensors(tmp_path):
    run = tmp_path / "run"
    train(compose(FAKE + ["trainer.epochs=1"]), str(run))
    ckpt = load_checkpoint(run / "checkpoints" / "best.pt")
    ckpt["model"]["conv1.weight"][0, 0, 0, 0] = float("nan")
    ckpt["model"]["bn1.running_var"][1] = float("inf")
    bad = tmp_path / "bad.pt"
    save_checkpoint(ckpt, bad)
    args = [f"checkpoint={bad}", "trainer.progress=false"]
    with pytest.raises(CheckpointError, match=r"NaN/inf values in 2 tensor\(s\): (conv1.weight, bn1.running_var|"
                                              r"bn1.running_var, conv1.weight)"):
        evaluate_checkpoint(compose(args, config_name="test"), args)
    # resuming it: the same refusal, with the advice for a diverged run
    with pytest.raises(CheckpointError, match=r"NaN/inf .*lower optim.lr"):
        train(compose(FAKE + ["trainer.epochs=2", f"trainer.resume={bad}"]), str(tmp_path / "resumed"))


@pytest.mark.parametrize("overrides, message", [
    (["optim.nesterov=true", "optim.momentum=0"], r"optim.nesterov=true needs optim.momentum > 0"),
    (["optim.nesterov=yes"], r"optim.nesterov must be true or false"),
    (["sched=cosine_warmup", "sched.warmup_epochs=5", "trainer.epochs=5"], r"warmup_epochs=5 must be below"),
    (["sched=cosine_warmup", "sched.warmup_start=2"], r"sched.warmup_start=2 must be in \(0, 1\]"),
    (["data.std=[0.5,0,0.5]"], r"data.std=\[0.5, 0, 0.5\] must hold finite numbers > 0"),
    (["trainer.seed=18446744073709551616"], r"trainer.seed=18446744073709551616 is too large"),
])
def test_values_that_would_fail_inside_torch_are_caught_by_the_checks(overrides, message):
    with pytest.raises(ConfigError, match=message) as e:
        check_config(compose(FAKE + overrides))
    assert "\n" not in str(e.value)


def test_the_largest_allowed_seed_runs(tmp_path):
    """The bound of the seed check is a real limit: 2**32 - 1 trains (seed + rank, seed + epoch fit 64 bits)."""
    train(compose(FAKE + ["trainer.epochs=1", f"trainer.seed={2 ** 32 - 1}"]), str(tmp_path / "run"))
