"""Calibration of post-training quantisation (addernet/quant/cli.py, calibration.py): what it reads and how,
independent of the loader's workers."""

import logging
import math
import re

import pytest
import torch
from omegaconf import OmegaConf

from addernet.checkpoint import save_checkpoint
from addernet.models import build_model
from addernet.quant import calibration_loader, quantize_for_eval
from addernet.test import main as evaluate_main
from addernet.tools import quantize

from helpers import CIFAR10_CLASSES, compose, run_main, write_jpeg_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """An ImageFolder tree with train/ (30 images) and test/ (10): data=cifar10_folder data.root=<it>."""
    root = tmp_path_factory.mktemp("calib")
    write_jpeg_folder(root / "train", 3, CIFAR10_CLASSES)
    write_jpeg_folder(root / "test", 1, CIFAR10_CLASSES, seed=1)
    return root


def _cfg(folder, *overrides):
    return compose(
        [
            "model=resnet20",
            "data=cifar10_folder",
            f"data.root={folder}",
            "data.pin_memory=false",
            "trainer.progress=false",
            "quant.bits=8",
            "quant.calib_images=24",
            "quant.calib_batch_size=8",
            *overrides,
        ],
        config_name="test",
    )


@torch.no_grad()
def _resnet20():
    """A random ResNet-20 whose BatchNorm statistics are its own activations' (so every adder layer sees inputs)."""
    torch.manual_seed(0)
    model = build_model("resnet20")
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.momentum = None
    model.train()(torch.randn(16, 3, 32, 32))
    return model.eval()


def _images(loader):
    return torch.cat([images for images, _ in loader])


def test_augmented_calibration_images_do_not_depend_on_the_loader_workers(folder):
    """Image i's augmentation is seeded by (quant.seed, i): the same tensors with 0, 1 or 2 workers, and in
    another batch size; the un-augmented images differ from them (the augmentation is really on)."""
    got = {w: _images(calibration_loader(_cfg(folder, f"data.num_workers={w}"), augment=True)) for w in (0, 1, 2)}
    assert torch.equal(got[0], got[1]) and torch.equal(got[0], got[2])
    rebatched = _images(calibration_loader(_cfg(folder, "data.num_workers=2", "quant.calib_batch_size=3"), True))
    assert torch.equal(got[0], rebatched)
    plain = _images(calibration_loader(_cfg(folder, "data.num_workers=0"), augment=False))
    assert plain.shape == got[0].shape and not torch.equal(plain, got[0])
    other_seed = _images(calibration_loader(_cfg(folder, "data.num_workers=0", "quant.seed=1"), augment=True))
    assert not torch.equal(other_seed, got[0])


@pytest.mark.slow  # two calibrations of a ResNet-20, worker processes
def test_the_calibrated_model_does_not_depend_on_the_loader_workers(folder):
    """The BatchNorm statistics re-estimated on augmented images (quant.bn_augment=true) and every quantised
    buffer are equal with 0 and 2 loader workers."""
    states = []
    for workers in (0, 2):
        model = _resnet20()
        torch.manual_seed(123 + workers)  # whatever the global RNG holds before calibrating
        quantize_for_eval(model, _cfg(folder, f"data.num_workers={workers}"))
        states.append(model.state_dict())
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


# ---- what calibration says, and the settings checked before any work ---------------------------------------


RANGES = "calibration: activation ranges of 20 adder layer(s)"
STAGES = {
    "defaults": [
        f"{RANGES} and BatchNorm input moments on training images, validation transform: "
        "24 image(s) in 3 batch(es) ...",
        "calibration: activation range of 20 adder layer(s), the best of 6 candidates each on 8 image(s) ...",
        "BN mean and variance shift: 22 BatchNorm layer(s) on the same training images, validation transform: "
        "24 image(s) in 3 batch(es) ...",
    ],
    "quant.act_range=quantile quant.bn_method=reestimate": [
        f"{RANGES} on training images, validation transform: 24 image(s) in 3 batch(es) ...",
        "BN re-estimation: 22 BatchNorm layer(s) on augmented training images: 24 image(s) in 3 batch(es) ...",
    ],
}


@pytest.mark.parametrize("setting", list(STAGES))
def test_each_calibration_stage_says_when_it_starts_and_what_it_processes(folder, caplog, setting):
    """With trainer.progress=false (no bar), every stage logs its start (what, on which images, how many) before
    its work, then its end with the seconds it took."""
    overrides = [] if setting == "defaults" else setting.split()
    with caplog.at_level(logging.INFO, logger="addernet.quant"):
        quantize_for_eval(_resnet20(), _cfg(folder, "data.num_workers=0", *overrides))
    lines = [r.getMessage() for r in caplog.records if r.name == "addernet.quant"]
    starts = [i for i, m in enumerate(lines) if m.endswith("...")]
    assert [lines[i] for i in starts] == STAGES[setting]
    ends = [i for i, m in enumerate(lines) if re.search(r" (done, 24 image\(s\)|chosen) in [0-9.]+ s$", m)]
    assert len(ends) == len(starts) and all(s < e for s, e in zip(starts, ends))
    assert all(e < s for e, s in zip(ends, starts[1:]))


def test_asking_for_more_calibration_images_than_exist_is_one_warning_naming_the_count(folder, caplog):
    with caplog.at_level(logging.INFO, logger="addernet.quant"):
        quantize_for_eval(_resnet20(), _cfg(folder, "data.num_workers=0", "quant.calib_images=25600"))
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == [
        "quant.calib_images=25600 is more than the 30 images of the training split of data=cifar10_folder: "
        "calibrating on 30"
    ]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, folder):
    """A ResNet-20 AdderNet checkpoint in our format, for data=cifar10_folder data.root=<folder>."""
    cfg = compose(["model=resnet20", "data=cifar10_folder", f"data.root={folder}"])
    path = tmp_path_factory.mktemp("ckpt") / "best.pt"
    config = OmegaConf.to_container(cfg, resolve=True)
    save_checkpoint({"format_version": 1, "model": _resnet20().state_dict(), "config": config, "epoch": 1}, path)
    return path


BAD_SETTINGS = [
    ("quant.act_range_floor=0", "quant.act_range_floor must be a positive number, got 0.0."),
    ("quant.act_range_floor=-1", "quant.act_range_floor must be a positive number, got -1.0."),
    ("quant.act_range_floor=nan", "quant.act_range_floor must be a positive number, got nan."),
    ("quant.act_range_floor=inf", "quant.act_range_floor must be a positive number, got inf."),
    ("quant.act_quantile=0", "quant.act_quantile=0.0 must be a number in (0, 1], e.g. 0.9994."),
    ("quant.act_quantile=nan", "quant.act_quantile=nan must be a number in (0, 1], e.g. 0.9994."),
    ("quant.act_quantile=1.5", "quant.act_quantile=1.5 must be a number in (0, 1], e.g. 0.9994."),
    ("quant.calib_images=0", "quant.calib_images must be an integer >= 1, got 0; e.g. quant.calib_images=1."),
    (
        "quant.calib_batch_size=-3",
        "quant.calib_batch_size must be an integer >= 1, got -3; e.g. quant.calib_batch_size=1.",
    ),
    ("quant.groups=0", "quant.groups must be an integer >= 1, got 0; e.g. quant.groups=1."),
    ("quant.seed=-1", "quant.seed must be an integer >= 0, got -1; e.g. quant.seed=1."),
    ("quant.bn_momentum=0", "quant.bn_momentum=0.0 must be null (exact average) or a number in (0, 1]."),
    ("quant.bn_momentum=nan", "quant.bn_momentum=nan must be null (exact average) or a number in (0, 1]."),
    (
        "quant.bits=1",
        "quant.bits=1 is not supported: use an integer from 2 to 16 (e.g. quant.bits=8), "
        "or quant.bits=null for the float model.",
    ),
    ("quant.grouping=median", "quant.grouping='median' is not valid; choose one of: kmeans, kmeans_sklearn."),
    ("quant.kernel=gpu", "quant.kernel='gpu' is not valid; choose one of: auto, int, fake."),
    ("quant.runtime=fast", "quant.runtime='fast' is not valid; choose one of: auto, integer, layers."),
    ("quant.weight_grid=log", "quant.weight_grid='log' is not valid; choose one of: unsigned, signed."),
]


@pytest.mark.parametrize(("setting", "message"), BAD_SETTINGS)
@pytest.mark.parametrize("entry", ["test.py", "quantize.py"])
def test_every_quant_setting_is_range_checked_before_any_work(tmp_path, entry, setting, message):
    """One line, exit 2, before the checkpoint is even read (a missing one is not what is reported)."""
    main = {"test.py": evaluate_main, "quantize.py": quantize.cli}[entry]
    args = [f"checkpoint={tmp_path / 'missing.pt'}", setting, "trainer.progress=false"]
    if entry == "quantize.py":
        args += [f"out={tmp_path / 'q.pt'}", *(["quant.bits=8"] if not setting.startswith("quant.bits") else [])]
    r = run_main(main, entry, args)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [f"{entry}: error: {message}"], r.stderr
    assert r.stdout == "" and not (tmp_path / "q.pt").exists()


def test_quantize_without_out_fails_at_once_in_one_line(tmp_path):
    r = run_main(quantize.cli, "quantize.py", [f"checkpoint={tmp_path / 'missing.pt'}", "quant.bits=8"])
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "quantize.py: error: no output file given: add out=PATH, the quantised checkpoint to write (e.g. out=q8.pt)"
    ]


def test_quantize_into_an_unwritable_place_fails_before_calibrating(tmp_path, checkpoint):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    args = [f"checkpoint={checkpoint}", "quant.bits=8", f"out={blocker}/sub/q.pt", "trainer.progress=false"]
    r = run_main(quantize.cli, "quantize.py", args)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"quantize.py: error: out={blocker}/sub/q.pt cannot be written: {blocker} is not a folder; choose another path."
    ]


def test_an_error_found_when_quantising_never_shares_a_line_with_the_test_bar(folder, checkpoint):
    """quant.groups=17 is refused once the model is known (its layers have 16 filters): before the test bar."""
    args = [f"checkpoint={checkpoint}", f"data.root={folder}", "data.num_workers=0", "quant.bits=8", "quant.groups=17"]
    r = run_main(evaluate_main, "test.py", [*args, "trainer.progress=true"])
    assert r.returncode == 2 and r.stderr.splitlines()[-1] == (
        "test.py: error: quant.groups=17 is more than the 16 filters of adder layer layer1.0.conv1; "
        "use quant.groups <= 16."
    ), r.stderr
    assert "test:" not in r.stderr  # the evaluation (and its bar) never started


# ---- the BatchNorm correction and the range of least squared error, against references ----------------------


def _two_bn_net(seed):
    torch.manual_seed(seed)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(),
        torch.nn.Conv2d(4, 5, 3),
        torch.nn.BatchNorm2d(5),
    ).double()
    with torch.no_grad():
        for bn in (net[1], net[4]):
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
            bn.weight.uniform_(0.5, 1.5)
    return net.eval()


@pytest.mark.parametrize("scale", [False, True])
def test_shift_bn_moves_the_float_statistics_by_what_the_change_does_to_each_input(scale):
    """A 'quantised' net (its first convolution changed) corrected with the float net's moments: each BatchNorm's
    mean moves by the change of its input's mean over the images, its variance by the ratio of pooled variances
    (scale); the second BatchNorm's input is taken with the first already corrected. Reference written out here."""
    from addernet.quant.calibration import activation_ranges, shift_bn

    images = torch.randn(2, 6, 3, 7, 7, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    batches = [(x, torch.zeros(len(x))) for x in images]  # two batches of 6
    flt = _two_bn_net(0)
    moments = []
    activation_ranges(flt, batches, 0.999, progress=False, bn_moments=moments)
    quant = _two_bn_net(0)
    with torch.no_grad():
        quant[0].weight.add_(0.3 * torch.randn_like(quant[0].weight))
    shift_bn(quant, batches, moments, scale=scale, progress=False)

    def pooled(xs):  # (mean over all images, image-weighted mean of the per-batch variances), per channel
        flat = [x.transpose(0, 1).flatten(1) for x in xs]
        return torch.cat(flat, 1).mean(1), torch.stack([f.var(1, unbiased=False) for f in flat]).mean(0)

    ref, want = _two_bn_net(0), _two_bn_net(0)
    with torch.no_grad():
        want[0].weight.copy_(quant[0].weight)
        (mf, vf), (mq, vq) = pooled([ref[0](b) for b in images]), pooled([want[0](b) for b in images])
        want[1].running_mean += mq - mf
        want[1].running_var *= vq / vf if scale else 1
        # the per-batch correction of the first BatchNorm in place while the second one's input is measured
        inputs_q, inputs_f = [], []
        for b in images:
            bn1 = _two_bn_net(0)[1]
            m_b, v_b = (
                pooled([want[0](b)])[0] - pooled([ref[0](b)])[0],
                pooled([want[0](b)])[1] / pooled([ref[0](b)])[1],
            )
            bn1.running_mean += m_b
            bn1.running_var *= v_b if scale else 1
            inputs_q.append(want[3](want[2](bn1(want[0](b)))))
            inputs_f.append(ref[3](ref[2](ref[1](ref[0](b)))))
        (mf2, vf2), (mq2, vq2) = pooled(inputs_f), pooled(inputs_q)
        want[4].running_mean += mq2 - mf2
        want[4].running_var *= vq2 / vf2 if scale else 1
    for i in (1, 4):
        torch.testing.assert_close(quant[i].running_mean, want[i].running_mean, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(quant[i].running_var, want[i].running_var, rtol=1e-12, atol=1e-12)
    same = _two_bn_net(0)  # the float net corrected against itself: nothing moves
    shift_bn(same, batches, moments, scale=True, progress=False)
    torch.testing.assert_close(same.state_dict(), flt.state_dict(), rtol=1e-12, atol=1e-12)


def test_mse_range_of_uniform_values_is_the_closed_form_optimum():
    """x uniform on [0, 1] at 4 bits: E(x - Q_A(x))^2 = A^3 / (12 * 15^2) + (1 - A)^3 / 3, least at A = 30/31;
    the nearest of the 128 candidates max * i / 128 is 124/128."""
    from addernet.quant.calibration import mse_range

    x = torch.linspace(0, 1, 1_000_001)
    assert abs(30 / 31 - 124 / 128) < abs(30 / 31 - 123 / 128)
    assert mse_range(x, 4) == pytest.approx(124 / 128, abs=1e-9)
    assert mse_range(torch.zeros(10), 4) == 0.0


def test_activation_ranges_are_the_max_over_batches_of_each_quantile():
    """One pass, several quantiles: each range is the max over batches of the k-th smallest |x|, k = ceil(q n)
    (reference: a full sort), and a single quantile gives the same number as in the tuple."""
    from addernet.ops import Adder2d
    from addernet.quant.calibration import activation_ranges

    g = torch.Generator().manual_seed(0)
    net = torch.nn.Sequential(torch.nn.ReLU(), Adder2d(3, 4, 3)).eval()
    batches = [(torch.randn(5, 3, 6, 6, generator=g) * (i + 1), None) for i in range(3)]
    qs = (0.5, 0.9, 0.999, 1.0)
    got = activation_ranges(net, batches, qs, progress=False)["1"]
    want = []
    for q in qs:
        per_batch = []
        for x, _ in batches:
            v = torch.relu(x).flatten().sort().values
            per_batch.append(v[math.ceil(q * v.numel()) - 1].item())
        want.append(max(per_batch))
    assert got == pytest.approx(tuple(want), rel=0, abs=0)
    assert activation_ranges(net, batches, 0.9, progress=False)["1"] == got[1]


@pytest.mark.parametrize("bits", [8, 4])
def test_the_output_range_is_the_candidate_of_least_output_error_variance(bits):
    """output_range against the error of each candidate computed here with the float64 reference adder and the
    dequantised formulas of the unsigned grid (clamp to [0, A], levels A/(2^b-1), the group scale A as every
    candidate is below max |w|); inputs with rare outliers."""
    from addernet.ops import Adder2d
    from addernet.ops.reference import adder2d_reference
    from addernet.quant.convert import output_range

    g = torch.Generator().manual_seed(bits)
    adder = Adder2d(6, 5, 3, padding=1)
    with torch.no_grad():
        adder.weight.copy_(torch.randn(adder.weight.shape, generator=g) * 5)  # max |w| above every candidate
    x = torch.rand(4, 6, 8, 8, generator=g)
    x[x > 0.995] *= 8  # rare large values: clipping them or not is the trade-off
    candidates = (0.3, 0.9, 1.5, 4.0, 8.0)
    lv = 2**bits - 1

    def error_variance(a):
        w = adder.weight.detach().double()
        clamped = w.clamp(0, a)
        beta = -(w - clamped).abs().flatten(1).sum(1).view(1, -1, 1, 1)
        wq = (clamped * lv / a).round() * a / lv
        xq = (x.double() * lv / a).round().clamp(0, lv) * a / lv
        e = adder2d_reference(xq, wq, (1, 1), (1, 1)) + beta - adder2d_reference(x.double(), w, (1, 1), (1, 1))
        return e.transpose(0, 1).flatten(1).var(1, unbiased=False).mean().item()

    scores = [error_variance(a) for a in candidates]
    settings = (bits, 1, "kmeans", 0, "fake", "unsigned")
    assert output_range(adder, candidates, x, settings) == candidates[scores.index(min(scores))]
    assert len({round(s, 6) for s in scores}) == len(scores)  # a real choice, not a tie
