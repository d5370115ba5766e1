"""task=kd: the loss is Hinton et al.'s formula, the teacher is frozen (no grad, eval, unchanged, same AMP dtype,
not in the optimizer), its validation metrics are reported, and bad teachers stop before any training step."""

import json

import pytest
import torch

from addernet.checkpoint import load_checkpoint, save_checkpoint, training_checkpoint
from addernet.data import build_loader
from addernet.engine import evaluate, model_from_config, train
from addernet.errors import CheckpointError, ConfigError
from addernet.tasks import build_task

from helpers import KD_RUN, compose, conv_teacher_file, f32_ce_bound, f32_sum_bound, kd_cfg, run_entry


def test_loss_equals_the_formula_computed_independently(tmp_path):
    path, teacher = conv_teacher_file(tmp_path)
    cfg = kd_cfg(path, "task.temperature=3", "task.alpha=0.7")
    torch.manual_seed(0)
    student = model_from_config(cfg)
    task = build_task(student, cfg)
    task.to("cpu")
    task.train()
    x, y = torch.randn(8, 3, 28, 28), torch.randint(0, 10, (8,))
    out = task(x, y)

    zs = student(x).double()  # train mode: the same batch statistics as the task's forward
    with torch.no_grad():
        zt = teacher(x).double()
    T, a = 3.0, 0.7
    lse_t, lse_s = torch.log(torch.exp(zt / T).sum(1, keepdim=True)), torch.log(torch.exp(zs / T).sum(1, keepdim=True))
    p_t = torch.exp(zt / T - lse_t)
    kl = (p_t * ((zt / T - lse_t) - (zs / T - lse_s))).sum(1).mean()
    ce = -(zs - torch.log(torch.exp(zs).sum(1, keepdim=True)))[torch.arange(8), y].mean()
    expected = (1 - a) * ce + a * T * T * kl
    # a formula, against float64: the KD term is a small difference of large terms (each log-probability is
    # z/T - logsumexp, rounded in float32 to about u of |z/T| + |logsumexp|), so its bound is absolute, scaled to them
    large = (p_t * ((zt / T).abs() + lse_t.abs() + (zs / T).abs() + lse_s.abs())).sum(1).mean().item()
    kd_bound = T * T * f32_sum_bound(large, 10 + 8)  # 10 classes, 8 images
    assert abs(out["kd"].item() - T * T * kl.item()) <= kd_bound
    ce_bound = f32_ce_bound(zs)
    assert abs(out["loss"].item() - expected.item()) <= a * kd_bound + (1 - a) * ce_bound
    assert abs(out["ce"].item() - ce.item()) <= ce_bound
    assert out["teacher_top1"].item() == pytest.approx(100.0 * (zt.argmax(1) == y).double().mean().item())


def test_teacher_gets_no_grad_stays_eval_runs_in_the_amp_dtype_and_is_not_trained(tmp_path):
    path, teacher = conv_teacher_file(tmp_path)
    cfg = kd_cfg(path)
    task = build_task(model_from_config(cfg), cfg)
    task.amp = "bf16"
    task.train()
    seen = []
    task.teacher.fc3.register_forward_hook(lambda m, i, o: seen.append((o.dtype, m.training, torch.is_grad_enabled())))
    out = task(torch.randn(8, 3, 28, 28), torch.randint(0, 10, (8,)))
    out["loss"].backward()
    assert seen == [(torch.bfloat16, False, False)]
    assert all(p.grad is None and not p.requires_grad for p in task.teacher.parameters())
    assert all(p.grad is not None for p in task.model.parameters())
    teacher_ids = {id(p) for p in task.teacher.parameters()}
    assert not teacher_ids & {id(p) for g in task.param_groups() for p in g["params"]}


def test_a_kd_run_leaves_the_teacher_unchanged_and_reports_its_val_metrics(tmp_path):
    path, teacher = conv_teacher_file(tmp_path)
    run = tmp_path / "run"
    cfg = kd_cfg(path, "trainer.epochs=1")  # 3 steps: enough for the teacher to be seen and left alone
    train(cfg, str(run))
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert {"train_ce", "train_kd", "train_teacher_top1", "teacher_val_top1", "teacher_val_loss"} <= set(records[-1])
    ckpt = load_checkpoint(run / "checkpoints" / "last.pt")
    original = torch.load(path, weights_only=True)
    assert set(ckpt["task"]) == {"teacher"}
    assert all(torch.equal(original[k], v) for k, v in ckpt["task"]["teacher"].items())  # BN stats included
    assert len(ckpt["optimizer"]["param_groups"]) == 1  # the student's only
    assert not any(k.startswith("teacher") for k in ckpt["model"])
    val = evaluate(teacher, build_loader(cfg.data, "val"), "cpu")
    assert records[-1]["teacher_val_top1"] == val["top1"]
    assert records[-1]["teacher_val_loss"] == pytest.approx(val["loss"], rel=1e-5)  # determinism: same code twice
    assert "teacher_val_top1" in (run / "train.log").read_text()


def test_our_checkpoint_builds_the_teacher_from_its_stored_config(tmp_path):
    teacher_run = tmp_path / "cnn"
    train(compose(KD_RUN + ["model.layer=conv", "trainer.epochs=1"]), str(teacher_run))
    best = teacher_run / "checkpoints" / "best.pt"
    cfg = compose(KD_RUN + ["task=kd", f"task.teacher={best}"])
    task = build_task(model_from_config(cfg), cfg)
    stored = load_checkpoint(best)["model"]
    assert all(torch.equal(stored[k], v) for k, v in task.teacher.state_dict().items())
    assert isinstance(task.teacher.conv2, torch.nn.Conv2d) and not task.teacher.training


def _our_checkpoint(tmp_path, **data):
    """A checkpoint of ours whose stored config says it was trained with ``data`` overrides."""
    overrides = [f"data.{k}={v}" for k, v in data.items()]
    cfg = compose(KD_RUN + ["model.layer=conv", *overrides])
    from omegaconf import OmegaConf

    model = model_from_config(cfg)
    ckpt = training_checkpoint(
        model=model.state_dict(),
        optimizer={},
        scheduler={},
        scaler={},
        epoch=1,
        step=0,
        best_top1=0.0,
        best_epoch=1,
        history=[],
        train_sums={},
        rng=None,
        config=OmegaConf.to_container(cfg, resolve=True),
        world_size=1,
    )
    return save_checkpoint(ckpt, tmp_path / "other.pt")


@pytest.mark.parametrize(
    "case, error, message",
    [
        ("missing", CheckpointError, "checkpoint not found"),
        ("truncated", CheckpointError, "truncated or corrupt"),
        ("classes", ConfigError, "data.num_classes=4 .* but the student uses data.num_classes=10"),
        ("size", ConfigError, "data.image_size=32 .* but the student uses data.image_size=28"),
        ("bare_classes", CheckpointError, "mis-shaped"),
        ("bare_no_layer", ConfigError, "task.teacher_layer=conv|adder"),
        ("temperature", ConfigError, "task.temperature must be a positive number"),
        ("alpha", ConfigError, r"task.alpha must be in \[0, 1\]"),
        ("unset", ConfigError, "task.teacher is not set"),
    ],
)
def test_bad_teachers_stop_before_any_training_step(tmp_path, case, error, message):
    teacher = tmp_path / "teacher.pt"
    extra = ["task.teacher_layer=conv"]
    if case == "truncated":
        full, _ = conv_teacher_file(tmp_path)
        teacher.write_bytes(full.read_bytes()[:2000])
    elif case in ("classes", "size"):
        teacher = _our_checkpoint(tmp_path, **({"num_classes": 4} if case == "classes" else {"image_size": 32}))
        extra = []
    elif case == "bare_classes":
        teacher, _ = conv_teacher_file(tmp_path, num_classes=4)
    elif case == "bare_no_layer":
        teacher, _ = conv_teacher_file(tmp_path)
        extra = []
    elif case in ("temperature", "alpha", "unset"):
        teacher, _ = conv_teacher_file(tmp_path)
        extra += {"temperature": ["task.temperature=0"], "alpha": ["task.alpha=1.5"], "unset": []}[case]
    overrides = KD_RUN + ["task=kd"] + ([] if case == "unset" else [f"task.teacher={teacher}"]) + extra
    run = tmp_path / "run"
    with pytest.raises(error, match=message):
        train(compose(overrides), str(run))
    assert not (run / "metrics.jsonl").exists() and not (run / "checkpoints" / "last.pt").exists()


def test_train_py_exits_non_zero_with_one_line_for_a_missing_teacher(tmp_path):
    proc = run_entry(
        "train.py", KD_RUN + ["task=kd", f"task.teacher={tmp_path / 'nope.pt'}", f"hydra.run.dir={tmp_path / 'r'}"]
    )
    assert proc.returncode == 2
    assert "train.py: error: checkpoint not found" in proc.stderr and "Traceback" not in proc.stderr
