"""End-to-end training runs: run-dir contents, metrics, TensorBoard events, checkpoints, errors."""

import json
import math

import pytest
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from addernet import AdaptiveLR, Adder2d
from addernet.checkpoint import load_checkpoint
from addernet.data import build_loader
from addernet.engine import NonFiniteLoss, evaluate, model_from_config, train
from addernet.ops.kernels import cpu, eager

from helpers import (
    CIFAR10_CLASSES,
    FAKE,
    FAST,
    RUN_FILES,
    compose,
    folder_run,
    forbid_env_writes,
    run_entry,
    run_train,
    trust_cifar10_md5,
    write_cifar10,
)

METRIC_KEYS = {
    "epoch",
    "lr",
    "train_loss",
    "train_top1",
    "val_loss",
    "val_top1",
    "val_top5",
    "val_n",
    "epoch_seconds",
    "images_per_s",
    "val_images_per_s",
}
CKPT_KEYS = {
    "format_version",
    "model",
    "optimizer",
    "scheduler",
    "scaler",
    "epoch",
    "step",
    "best_top1",
    "best_epoch",
    "history",
    "train_sums",
    "rng",
    "config",
    "world_size",
    "classes",
}  # classes: CIFAR names
TB_SCALARS = {"train/loss", "train/top1", "val/loss", "val/top1", "val/top5", "watch/lr", "watch/images_per_s"}


@pytest.mark.slow  # a full-size network (the default config's ResNet-20)
def test_one_epoch_resnet20_on_cifar10_pickles(tmp_path, monkeypatch):
    written = write_cifar10(tmp_path / "data", n_train=40, n_test=37)
    trust_cifar10_md5(monkeypatch, written["md5"])
    cfg = compose(
        [f"data.root={tmp_path / 'data'}", "data.download=false", "data.batch_size=20", "trainer.epochs=1", *FAST]
    )
    run = tmp_path / "run"
    summary = train(cfg, str(run))

    assert {p.name for p in run.iterdir()} == RUN_FILES
    assert OmegaConf.load(run / "config.yaml") == OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    [record] = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert set(record) == METRIC_KEYS
    assert record["epoch"] == 1 and record["lr"] == 0.1 and record["val_n"] == 37
    assert 0 <= record["val_top1"] <= record["val_top5"] <= 100 and math.isfinite(record["train_loss"])
    assert summary["best_top1"] == record["val_top1"] and summary["best_epoch"] == 1
    assert "epoch 1/1 lr 0.10000" in (run / "train.log").read_text()

    # Checkpoints: full state, plain-dict config, and weights that reproduce the logged validation numbers.
    ckpt = load_checkpoint(run / "checkpoints" / "last.pt")
    assert set(ckpt) == CKPT_KEYS and ckpt["format_version"] == 1 and ckpt["epoch"] == 1 and ckpt["step"] == 0
    assert ckpt["classes"] == CIFAR10_CLASSES
    assert ckpt["config"] == OmegaConf.to_container(cfg, resolve=True) and ckpt["history"] == [record]
    assert set(load_checkpoint(run / "checkpoints" / "best.pt")) == CKPT_KEYS
    model = model_from_config(cfg)
    model.load_state_dict(ckpt["model"])
    val = evaluate(model, build_loader(cfg.data, "val"), "cpu")
    # determinism on one machine: the logged validation recomputed from the checkpoint (loss: another batch order)
    assert val["n"] == 37 and val["top1"] == record["val_top1"] and val["top5"] == record["val_top5"]
    assert val["loss"] == pytest.approx(record["val_loss"], rel=1e-5)

    # TensorBoard: the run's curves, hparams, and in a run of its own one adaptive-LR curve and one
    # weight histogram per adder layer, tagged to sort after the curves.
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"histograms": 0, "scalars": 0})
    events.Reload()
    adder_layers = [n for n, m in model.named_modules() if isinstance(m, Adder2d)]
    assert len(adder_layers) == 20  # ResNet-20: 18 body 3x3 layers + 2 shortcut projections
    assert adder_layers == AdaptiveLR(model).names
    tags = events.Tags()
    hparam = {"val_summary/best_top1", "val_summary/final_top1"}  # the hparams summary, in the same dir (one run)
    assert TB_SCALARS | hparam == set(tags["scalars"]) and not tags["histograms"]
    for tag, key in (("val/top1", "val_top1"), ("train/loss", "train_loss"), ("watch/lr", "lr")):
        [event] = events.Scalars(tag)
        assert event.step == 1 and event.value == pytest.approx(record[key], rel=1e-6)
    layers = EventAccumulator(str(run / "tensorboard" / "diagnostics"), size_guidance={"histograms": 0, "scalars": 0})
    layers.Reload()
    assert {f"weights/adaptive_lr/{n}" for n in adder_layers} == set(layers.Tags()["scalars"])
    assert {f"weights/{n}" for n in adder_layers} == set(layers.Tags()["histograms"])
    alpha = layers.Scalars(f"weights/adaptive_lr/{adder_layers[0]}")[0].value
    assert 0 < alpha < float("inf")
    assert min(layers.Tags()["scalars"]) > max(tags["scalars"])  # sorted after every curve of the run
    assert [p.name for p in (run / "tensorboard").iterdir() if p.is_dir()] == ["diagnostics"]
    assert events.PluginTagToContent("hparams")


@pytest.mark.slow
def test_train_py_on_a_jpeg_image_folder(tmp_path, jpeg_cifar):
    run = tmp_path / "run"
    proc = run_train(folder_run(jpeg_cifar, f"hydra.run.dir={run}"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {p.name for p in run.iterdir()} == RUN_FILES | {".hydra"}
    assert OmegaConf.load(run / ".hydra" / "config.yaml").data.root == str(jpeg_cifar)
    [record] = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert record["val_n"] == 37 and set(record) == METRIC_KEYS
    assert {p.name for p in (run / "checkpoints").iterdir()} == {"last.pt", "best.pt"}


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(cfg_train, tiny_run):
    cfg_train.trainer.epochs = 1
    run = tiny_run()
    last = run / "checkpoints" / "last.pt"
    before = last.read_bytes()
    poisoned = compose(
        FAKE
        + [
            "trainer.epochs=2",
            "data.std=[1e-45,1e-45,1e-45]",  # inputs overflow to inf
            "trainer.resume_override=true",
        ]
    )
    with pytest.raises(NonFiniteLoss, match="non-finite loss .* epoch 2 step 1.*last good state \\(epoch 1\\)"):
        train(poisoned, str(run))
    assert last.read_bytes() == before and load_checkpoint(last)["epoch"] == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["data.root={tmp}", "data.download=false"], "CIFAR10 is not in {tmp}/cifar-10-batches-py"),
    ],
)
def test_user_errors_exit_with_a_message_not_a_traceback(tmp_path, args, message):
    """train.py turns user mistakes into one message and a non-zero exit (more cases, some in a new process, in
    test_bad_input_inputs.py)."""
    args = [a.format(tmp=tmp_path) for a in args] + [f"hydra.run.dir={tmp_path / 'run'}"]
    proc = run_entry("train.py", args)
    assert proc.returncode != 0
    assert message.format(tmp=tmp_path) in proc.stderr and "Traceback" not in proc.stderr


def test_the_callers_config_is_not_changed_by_a_run(tmp_path):
    """data.num_workers=auto: the run records the number it used; the config passed in keeps ``auto``."""
    cfg = compose(
        [
            "data=fake",
            "data.train_size=8",
            "data.val_size=4",
            "data.batch_size=4",
            "model=resnet20",
            "trainer.epochs=1",
            "trainer.progress=false",
            "data.num_workers=auto",
        ]
    )
    before = OmegaConf.to_yaml(cfg)
    train(cfg, str(tmp_path / "run"))
    assert OmegaConf.to_yaml(cfg) == before
    recorded = OmegaConf.load(tmp_path / "run" / "config.yaml").data.num_workers
    assert isinstance(recorded, int) and recorded >= 1


def test_the_adder_backend_is_applied_from_the_config_and_recorded(tmp_path, monkeypatch):
    """trainer.backend=eager runs the eager kernel, and config.yaml, run.json and train.log say so."""
    calls = {"eager": 0, "cpu": 0}
    for name, module in (("eager", eager), ("cpu", cpu)):

        def counted(*args, _name=name, _forward=module.forward):
            calls[_name] += 1
            return _forward(*args)

        monkeypatch.setattr(module, "forward", counted)
    monkeypatch.delenv("ADDERNET_BACKEND", raising=False)
    forbid_env_writes(monkeypatch, "ADDERNET_BACKEND")  # the run passes its choice on, it does not set the variable
    cfg = compose(
        [
            "data=fake",
            "model=lenet5_bn",  # two adder layers: the eager kernel is slow on a ResNet-20
            "data.image_size=28",
            "data.train_size=8",
            "data.val_size=4",
            "data.batch_size=4",
            "trainer.epochs=1",
            "trainer.progress=false",
            "trainer.backend=eager",
            *FAST,
        ]
    )
    run = tmp_path / "run"
    train(cfg, str(run))
    assert calls["eager"] > 0 and calls["cpu"] == 0
    assert OmegaConf.load(run / "config.yaml").trainer.backend == "eager"
    assert json.loads((run / "run.json").read_text())["adder_kernel"] == "eager"
    assert "adder backend eager (eager kernel)" in (run / "train.log").read_text()
