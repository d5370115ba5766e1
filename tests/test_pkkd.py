"""task=pkkd: kernels equal their closed forms by unfolding, the feature loss is the independent formula, no
gradient leaks between the networks, the adaptive LR touches only the student's adder weights, rho stays out
of the student, layer selection, bad input, and DDP (2 gloo ranks) equals one process on the whole batch."""

import copy
import importlib
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from addernet import AdaptiveLR, Adder2d
from addernet.checkpoint import load_checkpoint
from addernet.engine import model_from_config, train
from addernet.errors import CheckpointError, ConfigError
from addernet.optim import build_optimizer
from addernet.tasks import build_task
from addernet.tasks.kernel_maps import conv_sq_distance, gaussian_kernel, laplacian_kernel

from helpers import (
    FAKE,
    TESTS,
    TINY_LENET,
    assert_exact_resume,
    child_env,
    compose,
    f32_sum_bound,
    folder_run,
    run_train,
    torchrun,
)

WORKER = TESTS / "ddp_pkkd_worker.py"
LENET = [
    *TINY_LENET,
    "trainer.epochs=1",
    "task=pkkd",
]


def unfolded(x, kernel_size, stride, padding, dilation):
    """N x (C*kh*kw) x L patches and the output H, W (the unfold formulation, independent of the kernels)."""
    cols = F.unfold(x, kernel_size, dilation=dilation, padding=padding, stride=stride)
    h, w = ((x.shape[2 + i] + 2 * padding - dilation * (kernel_size - 1) - 1) // stride + 1 for i in range(2))
    return cols, h, w


@pytest.mark.parametrize("stride, padding, dilation", [(1, 0, 1), (2, 1, 1), (1, 2, 2)])
def test_laplacian_kernel_of_an_adder_layer_equals_its_closed_form(stride, padding, dilation):
    torch.manual_seed(0)
    layer = Adder2d(3, 4, 3, stride=stride, padding=padding, dilation=dilation).double()
    x = torch.randn(2, 3, 9, 8, dtype=torch.float64)
    cols, h, w = unfolded(x, 3, stride, padding, dilation)
    l1 = (cols[:, None] - layer.weight.flatten(1)[None, :, :, None]).abs().sum(2).view(2, 4, h, w)
    sigma = 7.5
    torch.testing.assert_close(laplacian_kernel(layer(x), sigma), torch.exp(-l1 / sigma), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "stride, padding, dilation, groups, bias", [(1, 0, 1, 1, False), (2, 1, 1, 1, True), (1, 2, 2, 2, False)]
)
def test_gaussian_kernel_of_a_conv_layer_equals_its_closed_form(stride, padding, dilation, groups, bias):
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 6, 3, stride=stride, padding=padding, dilation=dilation, groups=groups, bias=bias).double()
    x = torch.randn(2, 4, 9, 8, dtype=torch.float64)
    cin, cout = 4 // groups, 6 // groups
    sq = []
    for g in range(groups):
        cols, h, w = unfolded(x[:, g * cin : (g + 1) * cin], 3, stride, padding, dilation)
        wg = conv.weight[g * cout : (g + 1) * cout].flatten(1)
        sq.append((cols[:, None] - wg[None, :, :, None]).pow(2).sum(2).view(2, cout, h, w))
    sq = torch.cat(sq, 1)
    torch.testing.assert_close(conv_sq_distance(x, conv(x), conv), sq, rtol=1e-9, atol=1e-9)
    two_sigma_sq = 20.0
    torch.testing.assert_close(
        gaussian_kernel(conv_sq_distance(x, conv(x), conv), two_sigma_sq),
        torch.exp(-sq / two_sigma_sq),
        rtol=1e-9,
        atol=1e-12,
    )


def _task(*extra):
    cfg = compose(LENET + list(extra))
    torch.manual_seed(0)
    task = build_task(model_from_config(cfg), cfg)
    task.to("cpu")
    return task.train(), cfg


@pytest.mark.parametrize("side", ["student", "teacher"])
def test_feature_loss_is_the_kernel_formula_by_unfolding_and_rho_starts_as_identity(side):
    task, _ = _task("task.kd_weight=0.5", "task.feature_weight=3", f"task.rho_side={side}")
    assert task.layers == ["conv2"] and set(task.extra_modules()) == {"teacher", "rho"}
    seen = {}
    task.model.conv2.register_forward_hook(lambda m, i, o: seen.__setitem__("a", i[0]))
    task.teacher.conv2.register_forward_hook(lambda m, i, o: seen.__setitem__("c", i[0]))
    x, y = torch.randn(8, 3, 28, 28), torch.randint(0, 10, (8,))
    out = task(x, y)
    wa, wc = task.model.conv2.weight.flatten(1), task.teacher.conv2.weight.flatten(1)
    ca, h, w = unfolded(seen["a"], 5, 1, 0, 1)
    cc, _, _ = unfolded(seen["c"], 5, 1, 0, 1)
    l1 = (ca[:, None] - wa[None, :, :, None]).abs().sum(2)
    l2 = (cc[:, None] - wc[None, :, :, None]).pow(2).sum(2)
    # First batch: the running means are this batch's means; rho is the identity.
    expected = F.mse_loss(torch.exp(-l1 / l1.mean()), torch.exp(-l2 / l2.mean()))
    assert out["feature"].item() == pytest.approx(expected.item(), rel=1e-4)
    # a formula against float64: a float32 mean of l1.numel() positive sums of 150 positive terms each
    exact = (ca.double()[:, None] - wa.double()[None, :, :, None]).abs().sum(2).mean().item()
    assert task.rho.student_scale.item() == pytest.approx(exact, rel=f32_sum_bound(1, 150 + l1.numel()))
    assert out["loss"].item() == pytest.approx(
        (out["ce"] + 0.5 * out["kd"] + 3 * out["feature"] + out["teacher_ce"]).item(), rel=1e-6
    )
    # rho lives in the task, not in the student (test.py evaluates the student as any AdderNet).
    assert not any("rho" in k for k in task.model.state_dict())
    assert torch.equal(task.rho.rho[0].weight.view(16, 16), torch.eye(16))
    out["loss"].backward()
    assert task.rho.rho[0].weight.grad.abs().sum() > 0  # rho learns on either side


def test_no_gradient_leaks_between_student_and_teacher():
    task, _ = _task("task.teacher_loss=ce")
    x, y = torch.randn(8, 3, 28, 28), torch.randint(0, 10, (8,))
    teacher = copy.deepcopy(task.teacher)
    task(x, y)["loss"].backward()
    F.cross_entropy(teacher.train()(x), y).backward()  # the teacher's own loss alone
    for (name, p), q in zip(task.teacher.named_parameters(), teacher.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7, msg=name)
    assert all(p.grad is not None for p in task.rho.parameters())


def test_adaptive_lr_touches_only_the_students_adder_weights():
    task, cfg = _task()
    groups = task.param_groups()
    assert len(groups) == 3  # student, teacher, rho: one optimizer, the same recipe
    optimizer = build_optimizer(cfg.optim, groups)
    adaptive = AdaptiveLR(task.model, 0.2).attach(optimizer)
    assert adaptive.names == ["conv2"]
    task(torch.randn(8, 3, 28, 28), torch.randint(0, 10, (8,)))["loss"].backward()
    others = {n: p.grad.clone() for n, p in [*task.teacher.named_parameters(), *task.rho.named_parameters()]}
    optimizer.step()
    for name, p in [*task.teacher.named_parameters(), *task.rho.named_parameters()]:
        assert torch.equal(p.grad, others[name]), name
    g = task.model.conv2.weight.grad
    assert g.norm().item() == pytest.approx(0.2 * g.numel() ** 0.5, rel=f32_sum_bound(1, g.numel()))  # float32 norm


def test_layer_selection_all_stage_last_and_names():
    cfg = compose(["task=pkkd", "task.layers=stage_last"])
    task = build_task(model_from_config(cfg), cfg)
    assert task.layers == ["layer1.2.conv2", "layer2.2.conv2", "layer3.2.conv2"]
    assert len(build_task(model_from_config(cfg), compose(["task=pkkd"])).layers) == 20
    cfg = compose(["task=pkkd", "model=vgg_small", "task.layers=stage_last"])
    assert build_task(model_from_config(cfg), cfg).layers == ["conv1", "conv3", "conv5"]  # each pooled after
    cfg = compose(["task=pkkd", "task.layers=[layer3.2.conv2,layer1.0.conv1]"])
    assert build_task(model_from_config(cfg), cfg).layers == ["layer1.0.conv1", "layer3.2.conv2"]


def test_a_frozen_pretrained_teacher_is_not_trained(tmp_path):
    teacher_cfg = compose(LENET + ["model.layer=conv"])
    path = tmp_path / "cnn.pt"
    torch.save(model_from_config(teacher_cfg).state_dict(), path)
    task, _ = _task(f"task.teacher={path}")
    assert task.trainable == ("rho",) and not task.teacher.training
    assert len(task.param_groups()) == 2 and not any(p.requires_grad for p in task.teacher.parameters())
    out = task(torch.randn(8, 3, 28, 28), torch.randint(0, 10, (8,)))
    out["loss"].backward()
    assert "teacher_ce" not in out and all(p.grad is None for p in task.teacher.parameters())


@pytest.mark.parametrize(
    "overrides, error, message",
    [
        (["model.layer=conv"], ConfigError, "task=pkkd distils a CNN into an AdderNet, but model.layer=conv"),
        (["task.teacher=/nonexistent/cnn.pt"], CheckpointError, "checkpoint not found"),
        (["task.teacher=/x.pt", "task.teacher_loss=dml"], ConfigError, "task.teacher_loss=dml trains the teacher"),
        (["task.temperature=-1"], ConfigError, "task.temperature must be a positive number"),
        (["task.layers=[nope]"], ConfigError, "task.layers names \\['nope'\\]"),
        (["task.sigma_momentum=2"], ConfigError, "task.sigma_momentum must be in"),
    ],
)
def test_bad_input_stops_before_any_training_step(tmp_path, overrides, error, message):
    run = tmp_path / "run"
    with pytest.raises(error, match=message):
        train(compose(LENET + overrides), str(run))
    assert not (run / "metrics.jsonl").exists()


def test_an_adder_checkpoint_is_refused_as_the_pkkd_teacher(tmp_path, official_r20):
    with pytest.raises(CheckpointError, match="holds adder weights"):
        train(
            compose(["task=pkkd", f"task.teacher={official_r20}", "data=fake", "trainer.device=cpu"]),
            str(tmp_path / "run"),
        )


@pytest.mark.slow
@pytest.mark.distributed
def test_ddp_two_processes_equal_one_process_on_the_whole_batch(tmp_path):
    worker = importlib.import_module(WORKER.stem)
    proc = torchrun([WORKER, tmp_path], timeout=240)
    assert proc.returncode == 0, f"torchrun failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"

    task = worker.build_task()
    init = copy.deepcopy({"student": task.model.state_dict(), **task.extra_state_dicts()})
    reference = worker.train(task, worker.make_batches())
    for rank in range(2):
        result = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        for part in ("student", "teacher", "rho"):
            assert set(result[part]) == set(reference[part])  # no "module." prefix: bare modules saved
            for name, value in reference[part].items():
                torch.testing.assert_close(result[part][name], value, rtol=1e-5, atol=1e-6, msg=f"{part}.{name}")
    for part, name in (("student", "body2.weight"), ("teacher", "body2.weight"), ("rho", "rho.0.weight")):
        assert (reference[part][name] - init[part][name]).abs().max() > 1e-3  # the steps moved every network
    assert reference["rho"]["updates"].item() == worker.STEPS


def _resume_args(root, run=None):
    args = folder_run(
        root, "data.batch_size=8", "task=pkkd", "trainer.epochs=3", "trainer.deterministic=true", "trainer.seed=3"
    )
    return args + ([f"hydra.run.dir={run}"] if run else [])


@pytest.mark.slow
def test_kill_and_resume_equals_uninterrupted_for_student_teacher_and_rho(tmp_path, jpeg_cifar):
    # SIGTERM mid-epoch 2 (a mid-epoch last.pt, RNG included), SIGKILL mid-epoch 3 (nothing saved), resume
    ref, got = assert_exact_resume(
        _resume_args(jpeg_cifar),
        at="epoch 2/3 step 2/6",
        kill_at="epoch 3/3 step 3/6",
        root=tmp_path,
        parts=("model", "task"),
    )
    assert set(got["task"]) == {"teacher", "rho"}
    init = build_task(model_from_config(compose(_resume_args(jpeg_cifar))), compose(_resume_args(jpeg_cifar)))
    assert not torch.equal(init.teacher.conv2.weight, ref["task"]["teacher"]["conv2.weight"])  # the teacher trained


@pytest.mark.slow
@pytest.mark.distributed
def test_torchrun_pkkd_run_checkpoints_bare_student_teacher_and_rho(tmp_path):
    """The engine path: scripts/dist_train.sh 2 task=pkkd; rank 0's checkpoint holds bare (unwrapped) modules."""
    run = tmp_path / "run"
    args = [*FAKE, "data.val_size=13", "data.batch_size=8", "trainer.epochs=1", "task=pkkd"]
    proc = run_train(
        args,
        script=("bash", "scripts/dist_train.sh", "2"),
        timeout=300,
        env=child_env(PYTHON=sys.executable, RUN_DIR=str(run)),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    ckpt = load_checkpoint(run / "checkpoints" / "last.pt")
    assert ckpt["world_size"] == 2 and set(ckpt["task"]) == {"teacher", "rho"}
    assert not any(k.startswith("module.") for part in ckpt["task"].values() for k in part)
    assert len(ckpt["optimizer"]["param_groups"]) == 3
    text = (run / "train.log").read_text()
    assert "| 2 process(es) |" in text and "teacher_val_top1" in text and "train_feature" in text
