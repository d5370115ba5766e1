"""The optional training features (each off by default): their results against independent references.

Label smoothing is checked against the closed form of the smoothed cross-entropy in float64; accumulation and
clipping against a whole-batch step written out with torch's SGD (and under DDP, with the all-reduces counted).
"""

import pytest
import torch
import torch.nn.functional as F

from addernet.engine import model_from_config
from addernet.engine.config import check_config
from addernet.errors import ConfigError
from addernet.tasks import build_task

from helpers import (
    TESTS,
    TINY_LENET,
    compose,
    conv_teacher_file,
    f32_ce_bound,
    kd_cfg,
    small_adder_net,
    small_batches,
    torchrun,
)

LENET = [
    *TINY_LENET,
    "trainer.epochs=1",
    "data.num_workers=0",
    "data.pin_memory=false",
    "trainer.log_every=1",
]


def smoothed_ce(logits, target, eps):
    """(1 - eps) * NLL(y) + eps * mean_k(-log p_k): the label-smoothed cross-entropy, float64."""
    logp = torch.log_softmax(logits.double(), 1)
    return ((1 - eps) * -logp[torch.arange(len(target)), target] - eps * logp.mean(1)).mean()


def _task(*overrides):
    cfg = compose(LENET + list(overrides))
    torch.manual_seed(0)
    task = build_task(model_from_config(cfg), cfg)
    task.to("cpu")
    return task.train()


@pytest.mark.parametrize("task_args", [["task=classification"], ["task=pkkd"]])
def test_label_smoothing_is_the_smoothed_cross_entropy_of_the_student(task_args):
    x, y = torch.randn(8, 3, 28, 28, generator=torch.Generator().manual_seed(1)), torch.arange(8) % 10
    plain, smooth = _task(*task_args), _task(*task_args, "task.label_smoothing=0.2")
    out0, out = plain(x, y), smooth(x, y)
    torch.testing.assert_close(out["output"], out0["output"])  # same weights, same batch
    ce = out.get("ce", out["loss"])
    # a formula against float64, within the float32 rounding of a cross-entropy of these logits
    bound = f32_ce_bound(out["output"])
    assert ce.item() == pytest.approx(smoothed_ce(out["output"], y, 0.2).item(), abs=bound)
    assert out0.get("ce", out0["loss"]).item() == pytest.approx(smoothed_ce(out0["output"], y, 0.0).item(), abs=bound)
    if "teacher_ce" in out:  # PKKD's co-trained teacher keeps the plain CE (docs/training.md)
        assert out["teacher_ce"].item() == pytest.approx(out0["teacher_ce"].item(), rel=1e-6)  # the same, twice
        assert (out["loss"] - out0["loss"]).item() == pytest.approx((out["ce"] - out0["ce"]).item(), abs=1e-5)


def test_label_smoothing_in_kd_applies_to_the_ce_term_only(tmp_path):
    path, _ = conv_teacher_file(tmp_path)
    x, y = torch.randn(8, 3, 28, 28, generator=torch.Generator().manual_seed(1)), torch.arange(8) % 10
    outs = []
    for extra in ([], ["task.label_smoothing=0.1"]):
        cfg = kd_cfg(path, "task.alpha=0.5", *extra)
        torch.manual_seed(0)
        task = build_task(model_from_config(cfg), cfg)
        task.to("cpu")
        outs.append(task.train()(x, y))
    plain, smooth = outs
    bound = f32_ce_bound(smooth["output"])  # a formula against float64, within a float32 cross-entropy's rounding
    assert smooth["ce"].item() == pytest.approx(smoothed_ce(smooth["output"], y, 0.1).item(), abs=bound)
    assert smooth["kd"].item() == pytest.approx(plain["kd"].item(), rel=1e-6)  # the same KL term computed twice
    assert smooth["loss"].item() == pytest.approx(0.5 * smooth["ce"].item() + 0.5 * smooth["kd"].item(), rel=1e-6)


@pytest.mark.parametrize(
    "override, message",
    [
        ("task.label_smoothing=1.0", "task.label_smoothing must be in [0, 1)"),
        ("task.label_smoothing=-0.1", "task.label_smoothing must be a non-negative number"),
        ("trainer.clip_grad_norm=0", "trainer.clip_grad_norm (or null: off) must be a positive number"),
        ("trainer.ema_decay=1.0", "trainer.ema_decay must be in (0, 1)"),
        ("data.auto_augment=augmix", "data.auto_augment (or null: off)='augmix' is not valid"),
        ("data.random_erasing=2", "data.random_erasing is a probability in [0, 1]"),
        ("data.mixup_alpha=-1", "data.mixup_alpha (0: off) must be a non-negative number"),
        ("trainer.accumulate=0", "trainer.accumulate must be an integer >= 1"),
        ("trainer.accumulate=5", "use data.batch_size >= 10 or a smaller trainer.accumulate"),
    ],
)
def test_bad_option_values_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        check_config(compose(LENET + [override]))


# ---- trainer.accumulate and trainer.clip_grad_norm: one optimizer step against plain references ----


def _engine_steps(batches, accumulate=1, clip=None, scaler_enabled=False, adaptive=True):
    from addernet import AdaptiveLR
    from addernet.engine.loop import LossWatch
    from addernet.engine.meters import MetricSums
    from addernet.engine.step import Stepper

    model = small_adder_net()
    cfg = compose(LENET)
    task = build_task(model, cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    alr = AdaptiveLR(model, 0.2).attach(opt) if adaptive else None
    scaler = torch.amp.GradScaler("cpu", enabled=scaler_enabled)
    stepper = Stepper(task, opt, scaler, alr, accumulate, clip)
    sums, watch = MetricSums(), LossWatch("cpu")
    task.train()
    for step, (x, y) in enumerate(batches, 1):
        stepper(x, y, sums, watch, step)
    return model, sums.compute()


def _reference_steps(batches, clip=None):
    """Whole-batch mean CE, backward, clip the non-adder gradients by torch's formula, normalise each adder
    weight gradient to eta * sqrt(k) (Eq. 12-13), then a plain torch SGD step: all written out here."""
    import math

    from addernet import Adder2d

    model = small_adder_net()
    adder = {id(m.weight) for m in model.modules() if isinstance(m, Adder2d)}
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    for x, y in batches:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x).float(), y).backward()  # the tasks' float32 logits
        others = [p for p in model.parameters() if id(p) not in adder]
        if clip is not None:
            norm = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in others))
            for p in others:
                p.grad.mul_(min(1.0, clip / (norm + 1e-6)))
        for p in model.parameters():
            if id(p) in adder:
                p.grad.mul_(0.2 * math.sqrt(p.grad.numel()) / p.grad.norm())
        opt.step()
    return model


def _assert_same_weights(a, b, rtol=1e-6):
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(x, y, rtol=rtol, atol=1e-9, msg=name)


@pytest.mark.parametrize("accumulate", [1, 3])
def test_accumulated_micro_batches_give_the_whole_batch_update(accumulate):
    batches = small_batches(7)  # 7 samples in 3 micro-batches: 3 + 2 + 2 (uneven shares are weighted)
    model, sums = _engine_steps(batches, accumulate=accumulate)
    _assert_same_weights(model, _reference_steps(batches))
    assert sums["n"] == 14


@pytest.mark.parametrize("scaler_enabled", [False, True])
def test_clip_grad_norm_clips_the_unscaled_non_adder_gradients(scaler_enabled):
    batches = small_batches(6)
    clipped = _reference_steps(batches, clip=0.05)
    plain = _reference_steps(batches)
    assert not torch.allclose(clipped.fc.weight, plain.fc.weight)  # the bound is active on this data
    model, _ = _engine_steps(batches, accumulate=2, clip=0.05, scaler_enabled=scaler_enabled)
    _assert_same_weights(model, clipped)


@pytest.mark.distributed
@pytest.mark.slow
def test_ddp_accumulation_all_reduces_once_per_step_and_equals_the_whole_batch(tmp_path):
    proc = torchrun([TESTS / "ddp_options_worker.py", tmp_path, 2], timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reference = _reference_steps(small_batches(8))
    for rank in range(2):
        result = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert result["allreduces"] == 2  # 2 steps x 2 micro-batches: only each step's last one all-reduces
        model = small_adder_net()
        model.load_state_dict(result["state"])
        _assert_same_weights(model, reference)


# ---- trainer.ema_decay ----


@pytest.mark.parametrize("layer", ["adder", "conv"])
def test_ema_is_the_recurrence_over_the_weights_and_batchnorm_buffers_after_each_step(layer):
    from addernet.engine.ema import WeightEMA
    from addernet.engine.loop import LossWatch
    from addernet.engine.meters import MetricSums
    from addernet.engine.step import Stepper

    cfg = compose(LENET + [f"model.layer={layer}"])
    torch.manual_seed(0)
    model = model_from_config(cfg)
    task = build_task(model, cfg).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ema = WeightEMA(model, 0.7)
    stepper = Stepper(task, opt, torch.amp.GradScaler("cpu", enabled=False), ema=ema)
    g = torch.Generator().manual_seed(2)
    expected = None
    for step in range(1, 4):
        x, y = torch.randn(6, 3, 28, 28, generator=g), torch.randint(0, 10, (6,), generator=g)
        stepper(x, y, MetricSums(), LossWatch("cpu"), step)
        now = {k: v.double() for k, v in model.state_dict().items() if v.is_floating_point()}
        expected = now if expected is None else {k: 0.7 * expected[k] + 0.3 * now[k] for k in now}
    got = ema.module.state_dict()
    assert any("running_var" in k for k in expected)  # BatchNorm buffers are averaged too
    for k, v in expected.items():
        torch.testing.assert_close(got[k].double(), v, rtol=1e-6, atol=1e-7, msg=k)
    assert not torch.allclose(got["fc3.weight"], model.state_dict()["fc3.weight"])


def _options_args(root, run=None, *extra):
    args = [
        "data=cifar10_folder",
        f"data.root={root}",
        "data.num_classes=4",
        "data.batch_size=16",
        "data.image_size=28",
        "model=lenet5_bn",
        "data.num_workers=0",
        "data.pin_memory=false",
        "trainer.epochs=2",
        "trainer.deterministic=true",
        "trainer.progress=false",
        "trainer.log_every=1",
        "trainer.seed=3",
        "trainer.amp=bf16",
        "trainer.ema_decay=0.9",
        "trainer.accumulate=2",
        "trainer.clip_grad_norm=1.0",
        "task.label_smoothing=0.1",
        "trainer.precise_bn=2",
        *extra,
    ]
    return args + ([f"hydra.run.dir={run}"] if run else [])


@pytest.mark.slow
def test_options_together_resume_exactly_after_sigterm_and_test_py_evaluates_the_ema(tmp_path, jpeg_cifar):
    import json

    from addernet.test import main as evaluate_main

    from helpers import assert_exact_resume, metrics_without_timing, run_main

    # SIGTERM mid-epoch 2 (in this process): a mid-epoch last.pt, then the resumed run equals the uninterrupted one
    ref, got = assert_exact_resume(
        _options_args(jpeg_cifar), at="epoch 2/2 step 1/3", root=tmp_path, parts=("model", "ema")
    )
    run = tmp_path / "interrupted"
    records = metrics_without_timing(run / "metrics.jsonl")
    assert {"ema_val_loss", "ema_val_top1", "ema_val_top5"} <= set(records[-1])
    assert "precise_bn_seconds" in json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert got["ema"]["n_averaged"].item() == 6  # 2 epochs x 3 steps
    # test.py ema=true evaluates the stored average: the logged ema_val_* of the last epoch (test.py's main in this
    # process)
    out = run_main(
        evaluate_main,
        "test.py",
        [
            f"checkpoint={run / 'checkpoints' / 'last.pt'}",
            "ema=true",
            "trainer.progress=false",
            "data.num_workers=0",
            "trainer.amp=bf16",
        ],
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["top1"] == records[-1]["ema_val_top1"] and result["loss"] == pytest.approx(
        records[-1]["ema_val_loss"]
    )
    plain = run_main(
        evaluate_main,
        "test.py",
        [
            f"checkpoint={run / 'checkpoints' / 'last.pt'}",
            "trainer.progress=false",
            "data.num_workers=0",
            "trainer.amp=bf16",
        ],
    )
    assert json.loads(plain.stdout.strip().splitlines()[-1])["loss"] == pytest.approx(records[-1]["val_loss"])
    assert result["loss"] != pytest.approx(records[-1]["val_loss"])  # the average is not the last weights


# ---- trainer.precise_bn ----


@pytest.mark.parametrize("layer", ["adder", "conv"])
def test_precise_bn_sets_the_statistics_to_the_batch_average_at_the_current_weights(layer, caplog):
    from addernet.engine.precise_bn import precise_bn

    cfg = compose(LENET + [f"model.layer={layer}"])
    torch.manual_seed(0)
    model = model_from_config(cfg).train()
    g = torch.Generator().manual_seed(4)
    batches = [(torch.randn(6, 3, 28, 28, generator=g) * 2 + 1, torch.zeros(6, dtype=torch.long)) for _ in range(4)]
    bn = model.bn2  # after the second (adder or conv) layer: inputs of size ~1e2..1e4 for adder
    inputs = []
    handle = bn.register_forward_pre_hook(lambda m, args: inputs.append(args[0].detach().double()))
    with caplog.at_level("INFO", logger="addernet"):
        precise_bn(model, batches, 3, "cpu")  # the first 3 of the 4 batches
    assert "precise BN: 2 BatchNorm layer(s) done, 18 image(s)" in caplog.text
    handle.remove()
    assert len(inputs) == 3 and model.training  # the model's mode is kept
    mean = torch.stack([x.mean((0, 2, 3)) for x in inputs]).mean(0)
    var = torch.stack([x.var((0, 2, 3), unbiased=True) for x in inputs]).mean(0)
    torch.testing.assert_close(bn.running_mean.double(), mean, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(bn.running_var.double(), var, rtol=1e-5, atol=1e-3)
    assert bn.running_mean.abs().max() > (1e2 if layer == "adder" else 0)


# ---- data.train_size / data.val_size, experiment=debug ----


def _pairs(ds):
    return [(bytes(x.numpy().tobytes()), int(y)) for x, y in (ds[i] for i in range(len(ds)))]


def test_train_and_val_size_take_the_same_seeded_subset_of_any_dataset_kind(tmp_path, monkeypatch, jpeg_cifar):
    from addernet.data import build_dataset

    from helpers import trust_cifar10_md5, write_cifar10

    written = write_cifar10(tmp_path / "c", n_train=40, n_test=30)
    trust_cifar10_md5(monkeypatch, written["md5"])
    kinds = [
        ["data=cifar10", f"data.root={tmp_path / 'c'}", "data.download=false", "data.transform=plain"],
        ["data=cifar10_folder", f"data.root={jpeg_cifar}", "data.num_classes=4", "data.transform=plain"],
    ]
    for args in kinds:
        full = compose(args)
        small = compose(args + ["data.train_size=10", "data.val_size=7", "trainer.seed=5"])
        for split, n in (("train", 10), ("val", 7)):
            whole, part = _pairs(build_dataset(full.data, split)), _pairs(build_dataset(small.data, split))
            assert len(part) == n and len(set(part)) == n and set(part) <= set(whole)  # images keep their labels
            assert part == _pairs(build_dataset(compose(args + [f"data.{split}_size={n}"]).data, split))
        assert build_dataset(small.data, "train").classes == build_dataset(full.data, "train").classes


def test_train_size_larger_than_the_set_is_a_data_error(jpeg_cifar):
    from addernet.data import build_dataset
    from addernet.errors import DataError

    cfg = compose(["data=cifar10_folder", f"data.root={jpeg_cifar}", "data.num_classes=4", "data.train_size=49"])
    with pytest.raises(DataError, match="data.train_size=49 is more than the 48 images"):
        build_dataset(cfg.data, "train")


def test_debug_preset_is_one_deterministic_epoch_of_a_few_batches(tmp_path, jpeg_cifar):
    from addernet.engine import train

    from helpers import metrics_without_timing

    args = [
        "experiment=debug",
        "data=cifar10_folder",
        f"data.root={jpeg_cifar}",
        "data.num_classes=4",
        "model=lenet5_bn",
        "data.image_size=28",
        "trainer.device=cpu",
        "data.train_size=32",
        "data.val_size=20",
    ]  # the fixture has 48 / 37 images
    for name in ("a", "b"):
        train(compose(args), str(tmp_path / name))
    # determinism on one machine: runs made in this test, bit for bit
    records = metrics_without_timing(tmp_path / "a" / "metrics.jsonl")
    assert records == metrics_without_timing(tmp_path / "b" / "metrics.jsonl")
    assert len(records) == 1 and records[0]["val_n"] == 20
    log = (tmp_path / "a" / "train.log").read_text()
    assert "step 2/2 " in log and "step 3/" not in log  # 32 images in batches of 16


# ---- data.auto_augment, data.random_erasing ----


def _fake_image(seed=0):
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    return Image.fromarray(torch.randint(0, 256, (32, 32, 3), generator=g, dtype=torch.uint8).numpy())


def test_random_erasing_zeroes_one_rectangle_of_the_normalised_training_image():
    from addernet.data.transforms import build_transform

    cfg = compose(["data=fake", "data.random_erasing=1.0"])
    image = _fake_image()
    plain = build_transform(compose(["data=fake"]).data, "train")(image)
    erased = build_transform(cfg.data, "train")(image)
    changed = (erased != plain).any(0)
    rows, cols = changed.any(1).nonzero().flatten(), changed.any(0).nonzero().flatten()
    box = (slice(int(rows[0]), int(rows[-1]) + 1), slice(int(cols[0]), int(cols[-1]) + 1))
    assert changed[box].all() and changed.sum() == changed[box].numel()  # one filled rectangle
    assert (erased[:, box[0], box[1]] == 0).all()
    torch.testing.assert_close(build_transform(cfg.data, "val")(image), plain)  # validation is never erased


@pytest.mark.parametrize("name", ["randaugment", "trivialaugment", "autoaugment"])
def test_auto_augment_changes_training_images_only_and_trains(name, tmp_path):
    from addernet.data.transforms import build_transform
    from addernet.engine import train

    cfg = compose(LENET + [f"data.auto_augment={name}"])
    image = _fake_image().resize((28, 28))
    plain = build_transform(compose(LENET).data, "train")(image)
    torch.manual_seed(0)
    outs = [build_transform(cfg.data, "train")(image) for _ in range(8)]
    assert any(not torch.equal(o, plain) for o in outs)
    torch.testing.assert_close(
        build_transform(cfg.data, "val")(image), build_transform(compose(LENET).data, "val")(image)
    )
    summary = train(cfg, str(tmp_path / "run"))
    assert summary["epochs"] == 1


def test_on_device_refuses_the_pil_augmentations_with_a_message():
    with pytest.raises(ConfigError, match="data.on_device=true implements the crop and flip"):
        check_config(compose(LENET + ["data.on_device=true", "data.auto_augment=randaugment"]))


# ---- data.mixup_alpha, data.cutmix_alpha ----


@pytest.mark.parametrize("mix", [["data.mixup_alpha=0.4"], ["data.cutmix_alpha=1.0"]])
def test_mixed_batches_train_on_soft_targets_and_count_top1_against_the_dominant_label(mix):
    import copy

    from addernet.data.mix import build_mix
    from addernet.engine.loop import LossWatch
    from addernet.engine.meters import MetricSums
    from addernet.engine.step import Stepper

    cfg = compose(LENET + ["data.num_classes=5", *mix])
    model = small_adder_net().float()
    task = build_task(model, cfg).train()
    before = copy.deepcopy(model)
    x, y = torch.randn(8, 3, 8, 8, generator=torch.Generator().manual_seed(5)), torch.arange(8) % 5
    torch.manual_seed(7)
    mixed, soft = build_mix(cfg.data)(x, y)
    # the mix is a convex combination of each sample with the batch rolled by one, labels likewise
    lam = soft[torch.arange(8), y]
    assert torch.allclose(soft.sum(1), torch.ones(8)) and ((0 <= lam) & (lam <= 1)).all()
    torch.testing.assert_close(soft, lam[:, None] * F.one_hot(y, 5) + (1 - lam[:, None]) * F.one_hot(y.roll(1), 5))
    if "mixup" in mix[0]:
        torch.testing.assert_close(mixed, lam[:, None, None, None] * x + (1 - lam[:, None, None, None]) * x.roll(1, 0))
    logits = before(mixed).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    stepper = Stepper(task, opt, torch.amp.GradScaler("cpu", enabled=False), mix=build_mix(cfg.data))
    sums = MetricSums()
    torch.manual_seed(7)  # the same draw inside the step
    stepper(x, y, sums, LossWatch("cpu"), 1)
    got = sums.compute()
    expected_loss = -(soft.double() * torch.log_softmax(logits, 1)).sum(1).mean()
    assert got["loss"] == pytest.approx(expected_loss.item(), rel=1e-5)
    assert got["top1"] == pytest.approx(100 * (logits.argmax(1) == soft.argmax(1)).double().mean().item())


def test_mixup_and_cutmix_train_adder_lenet_with_kd_targets(tmp_path):
    from addernet.engine import train

    summary = train(
        compose(LENET + ["data.mixup_alpha=0.2", "data.cutmix_alpha=1.0", "task=pkkd"]), str(tmp_path / "run")
    )
    assert summary["epochs"] == 1 and 0 <= summary["final"]["train_teacher_top1"] <= 100


def test_calibration_logs_its_counts(caplog):
    from addernet.quant.calibration import activation_ranges

    torch.manual_seed(0)
    model = model_from_config(compose(LENET)).eval()
    batches = [(torch.rand(5, 3, 28, 28), None), (torch.rand(4, 3, 28, 28), None)]
    with caplog.at_level("INFO", logger="addernet"):
        ranges = activation_ranges(model, batches, 0.999)
    assert list(ranges) == ["conv2"]
    assert "calibration: activation ranges of 1 adder layer(s) done, 9 image(s)" in caplog.text


@pytest.mark.distributed
@pytest.mark.slow
def test_every_option_together_under_torchrun_with_two_gloo_processes(tmp_path):
    import json

    from addernet.checkpoint import load_checkpoint

    run = tmp_path / "run"
    proc = torchrun(
        [
            "train.py",
            "model=lenet5_bn",
            "data=fake",
            "data.image_size=28",
            "data.train_size=64",
            "data.val_size=32",
            "data.batch_size=16",
            "trainer.epochs=1",
            "trainer.device=cpu",
            "trainer.progress=false",
            "data.num_workers=0",
            "trainer.ema_decay=0.9",
            "trainer.accumulate=2",
            "trainer.clip_grad_norm=1",
            "trainer.precise_bn=2",
            "task.label_smoothing=0.1",
            "data.mixup_alpha=0.2",
            "data.cutmix_alpha=1.0",
            "data.auto_augment=trivialaugment",
            "data.random_erasing=0.25",
            "trainer.amp=bf16",
            f"hydra.run.dir={run}",
        ],
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    [record] = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert record["val_n"] == 32 and {"ema_val_top1", "precise_bn_seconds"} <= set(record)
    assert json.loads((run / "run.json").read_text())["world_size"] == 2
    assert (
        load_checkpoint(run / "checkpoints" / "last.pt")["ema"]["n_averaged"].item() == 4
    )  # 64 images / global batch 16
