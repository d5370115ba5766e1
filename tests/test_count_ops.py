"""Op counter: closed-form layer counts, torch's own FLOP counter, the paper's tables, the script's JSON."""

import json

import pytest
import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

from addernet import Adder2d
from addernet.analysis import count_model_ops, count_ops
from addernet.models import build_model
from addernet.tools.count_ops import native_data

from helpers import run_script

# name -> (image size, classes) at the dataset's resolution
DATA = {
    "resnet20": (32, 10),
    "resnet32": (32, 10),
    "vgg_small": (32, 10),
    "lenet5_bn": (28, 10),
    "resnet18": (224, 1000),
    "resnet50": (224, 1000),
}


def _count(name, layer, **options):
    size, classes = DATA[name]
    return count_model_ops(name, layer, classes, None, size, **options)


def test_small_network_matches_hand_count():
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=True),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        Adder2d(8, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.MaxPool2d(2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4, 5),
    )
    r = count_ops(net, (3, 9, 9))
    # conv: 8x5x5 outputs x 27 MACs, + 200 bias adds; adder: 4x5x5 outputs x 72, two adds each;
    # linear: 20 MACs + 5 bias adds; BN: 200 + 100 elements; max-pool 2x2 -> 16 outputs x 3 compares;
    # adaptive avg-pool: 4 outputs x (3 adds + 1 mul)
    assert r["body"] == pytest.approx({"params": 288, "mul": 0, "add": 2 * 100 * 72, "energy_uj": 14400 * 0.9e-6})
    assert (r["stem_classifier"]["mul"], r["stem_classifier"]["add"]) == (5400 + 20, 5400 + 200 + 20 + 5)
    assert r["stem_classifier"]["params"] == 8 * 27 + 8 + 4 * 5 + 5
    assert (r["batchnorm"]["mul"], r["batchnorm"]["add"], r["batchnorm"]["params"]) == (300, 300, 24)
    assert (r["pooling"]["mul"], r["pooling"]["add"]) == (4, 16 * 3 + 4 * 3)
    assert (r["total"]["mul"], r["total"]["add"]) == (5724, 20385)
    assert r["total"]["params"] == sum(p.numel() for p in net.parameters())
    assert r["total"]["energy_uj"] == pytest.approx((5724 * 3.7 + 20385 * 0.9) * 1e-6)
    assert (r["paper"]["mul"], r["paper"]["add"]) == (5420, 14400 + 5625)


@pytest.mark.parametrize("name,n", [("resnet20", 3), ("resnet32", 5)])
def test_cifar_resnet_matches_closed_form(name, n):
    """Body = 3x3 convolutions of the three stages + the two 1x1 stride-2 shortcut projections."""
    body = (
        2 * n * 16 * 16 * 9 * 32 * 32
        + (16 * 32 * 9 + (2 * n - 1) * 32 * 32 * 9 + 16 * 32) * 16 * 16
        + (32 * 64 * 9 + (2 * n - 1) * 64 * 64 * 9 + 32 * 64) * 8 * 8
    )
    stem, fc = 3 * 16 * 9 * 32 * 32, 64 * 10
    conv, adder = _count(name, "conv"), _count(name, "adder")
    assert conv["body"]["mul"] == conv["body"]["add"] == body
    assert (adder["body"]["mul"], adder["body"]["add"]) == (0, 2 * body)
    assert adder["stem_classifier"]["mul"] == conv["stem_classifier"]["mul"] == stem + fc
    assert conv["residual"]["add"] == n * (16 * 32 * 32 + 32 * 16 * 16 + 64 * 8 * 8)


@pytest.mark.parametrize("name", DATA)
def test_conv_and_linear_macs_agree_with_torch_flop_counter(name):
    """torch's FlopCounterMode counts 2 FLOPs per MAC of every convolution and matmul (biases excluded)."""
    size, classes = DATA[name]
    with torch.device("meta"):
        model = build_model(name, "conv", classes).eval()
    with FlopCounterMode(display=False) as counter:
        model(
            torch.empty(
                1,
                model.get_submodule("conv0" if name == "vgg_small" else "conv1").in_channels,
                size,
                size,
                device="meta",
            )
        )
    conv, adder = _count(name, "conv"), _count(name, "adder")
    assert 2 * conv["paper"]["mul"] == counter.get_total_flops()
    assert adder["body"]["add"] == 2 * conv["body"]["mul"] and adder["body"]["mul"] == 0
    assert (
        adder["total"]["params"]
        == conv["total"]["params"]
        == sum(p.numel() for p in build_model(name, "adder", classes).parameters())
    )


# The AdderNet paper's (#Mul, #Add): CNN rows count Mul = Add = MACs, AdderNet rows 0 Mul and 2x Add.
PAPER = {
    "resnet20": (41.17e6, 82.34e6),
    "resnet32": (69.12e6, 138.24e6),
    "vgg_small": (0.65e9, 1.30e9),
    "resnet18": (1.8e9, 3.6e9),
    "resnet50": (3.9e9, 7.7e9),
    "lenet5_bn": (435e3, 870e3),
}
# The paper's AdderNet LeNet-5-BN has every layer an adder layer ("almost no multiplication", Sec. 4.1).
PAPER_OPTIONS = {"lenet5_bn": {"adder_layers": "all"}}
# VGG-small (LQ-Nets layout) has 607.6M MACs in all its convolution and linear layers together,
# 6.5% under the paper's 0.65G: no layer set of that architecture reaches 0.65G, so its row gets 7%.
TOL = {"vgg_small": 0.07}


@pytest.mark.parametrize("name", PAPER)
def test_paper_convention_matches_the_paper_tables(name):
    cnn, add = PAPER[name]
    tol = TOL.get(name, 0.05)
    conv = _count(name, "conv")["paper"]
    assert conv["mul"] == pytest.approx(cnn, rel=tol) and conv["add"] == pytest.approx(cnn, rel=tol)
    r = _count(name, "adder", **PAPER_OPTIONS.get(name, {}))
    assert r["paper"]["add"] == pytest.approx(add, rel=tol)
    # The paper rounds the AdderNet #Mul to 0; here it is exactly the multiplicative stem + classifier.
    assert r["paper"]["mul"] == r["stem_classifier"]["mul"] and r["body"]["mul"] == 0
    assert (r["paper"]["mul"] > 0) == (name not in PAPER_OPTIONS)


def test_all_adder_lenet_counts_twice_the_cnn_macs_and_only_batchnorm_multiplications():
    # LeNet-5 on the 32x32 (padded) input: conv1 6x28x28 outputs x 25, conv2 16x10x10 x 150, fc 400-120-84-10
    macs = 6 * 28 * 28 * 25 + 16 * 10 * 10 * 150 + 400 * 120 + 120 * 84 + 84 * 10
    r = _count("lenet5_bn", "adder", adder_layers="all")
    assert (r["paper"]["mul"], r["paper"]["add"]) == (0, 2 * macs)
    # BatchNorm after every layer, 1 Mul each output element; no other multiplication
    bn = 6 * 28 * 28 + 16 * 10 * 10 + 120 + 84 + 10
    assert r["total"]["mul"] == r["batchnorm"]["mul"] == bn
    twin = _count("lenet5_bn", "conv")
    assert twin["paper"]["mul"] == macs and r["total"]["mul"] < 0.02 * twin["total"]["mul"]


def test_count_ops_rejects_unknown_layers():
    with pytest.raises(ValueError, match="no rule for Softplus"):
        count_ops(nn.Sequential(nn.Conv2d(3, 4, 3), nn.Softplus()), (3, 8, 8))


def test_script_prints_table_then_json(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = run_script("scripts/count_ops.py", ["model=vgg_small", "model.layer=conv"])
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert any(line.startswith("whole network") for line in lines)
    got = json.loads(lines[-1])
    expected = json.loads(json.dumps(_count("vgg_small", "conv")))
    assert got == expected
    assert got["input"] == [1, 3, 32, 32] and got["paper_table"] == {"mul": 0.65e9, "add": 0.65e9}
    assert not list(tmp_path.iterdir()), "count_ops.py must not write a run directory"


def test_script_counts_at_the_models_native_input_unless_data_is_given():
    assert native_data(["model=lenet5_bn"]) == "data=mnist"
    assert native_data(["model=resnet18", "model.layer=conv"]) == "data=imagenet"
    assert native_data([]) == "data=cifar10"
    assert native_data(["model=resnet50", "data=cifar10"]) is None  # the user's choice wins
    assert native_data(["experiment=imagenet_resnet50_adder"]) is None


def test_script_counts_resnet50_at_imagenet_size_by_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = run_script("scripts/count_ops.py", ["model=resnet50"])
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["input"] == [1, 3, 224, 224] and got == json.loads(json.dumps(_count("resnet50", "adder")))
