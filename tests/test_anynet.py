"""Adder layers for any network: AdderLinear and the L1 attention scores against float64 closed forms,
AdderAttention against a broadcast reference, adderize on torchvision and plain networks, the adaptive LR,
op counts and the quantisation / ONNX refusals."""

import math
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

from addernet import AdaptiveLR, Adder2d, AdderAttention, AdderLinear, adder2d, adder_linear, adderize, l1_scores
from addernet.analysis import count_ops
from addernet.engine import model_from_config
from addernet.errors import ConfigError
from addernet.models import build_model
from addernet.ops.kernels import cpu
from addernet.ops.reference import adder2d_reference
from addernet.quant.convert import quantize_model
from addernet.quant.onnx import onnx_ready
from addernet.tasks import build_task

from helpers import TINY_VIT, compose, f32_sum_bound

BACKENDS = ["fast", "eager"]


def _closed_linear(x, w, b, g):
    """float64 broadcast: y = -sum|x - w| + b, dx = sum_j g HardTanh(w - x), dw = sum g (x - w), db = sum g."""
    d = x.unsqueeze(-2) - w  # (..., out, in) = x - w
    y = -d.abs().sum(-1) + (0 if b is None else b)
    dx = (g.unsqueeze(-1) * (-d).clamp(-1, 1)).sum(-2)
    dw = (g.unsqueeze(-1) * d).reshape(-1, *w.shape).sum(0)
    return y, dx, dw, None if b is None else g.reshape(-1, w.shape[0]).sum(0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("lead", [(), (2, 3), (2, 1, 4)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("threads", [1, 3])  # 3 threads: the row split pads the rows to a multiple of 3
def test_adder_linear_forward_and_gradients_equal_closed_form(backend, lead, bias, threads, monkeypatch):
    monkeypatch.setenv("ADDERNET_BACKEND", backend)
    monkeypatch.setattr(cpu, "SERIAL_WORK", 0)  # the C kernel runs the split even for these few rows
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        layer = AdderLinear(7, 5, bias=bias).double()
        if bias:
            nn.init.normal_(layer.bias)
        x = torch.randn(*lead, 7, dtype=torch.float64, requires_grad=True)
        y = layer(x)
        g = torch.randn_like(y)
        y.backward(g)
    finally:
        torch.set_num_threads(old)
    want_y, want_dx, want_dw, want_db = _closed_linear(
        x.detach(), layer.weight.detach(), None if not bias else layer.bias.detach(), g
    )
    assert y.shape == (*lead, 5)
    torch.testing.assert_close(y, want_y, rtol=0, atol=1e-12)
    torch.testing.assert_close(x.grad, want_dx, rtol=0, atol=1e-12)
    torch.testing.assert_close(layer.weight.grad, want_dw, rtol=0, atol=1e-12)
    if bias:
        torch.testing.assert_close(layer.bias.grad, want_db, rtol=0, atol=1e-12)


def test_adder_linear_float32_matches_float64_at_adder_scale():
    # outputs ~ -1e3: float32 accumulation must stay within float32 rounding of the float64 result
    torch.manual_seed(1)
    x, w = torch.randn(64, 1000) * 2, torch.randn(32, 1000)
    want = -(x.double().unsqueeze(1) - w.double()).abs().sum(-1)
    got = adder_linear(x, w).double()
    assert want.abs().min() > 1000
    assert ((got - want).abs() / want.abs()).max() < 1e-5


@pytest.fixture
def two_threads(monkeypatch):
    """The C kernels on two threads, with no serial cut-off: the splits across threads run even on small inputs."""
    monkeypatch.setenv("ADDERNET_BACKEND", "fast")
    monkeypatch.setattr(cpu, "SERIAL_WORK", 0)
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(old)


@pytest.mark.parametrize("lead", [(3, 11), (1, 33)])
@pytest.mark.parametrize("features", [19, 32])  # 32: a multiple of every vector width, the rows used in place
def test_adder_linear_float32_on_two_threads_within_float32_rounding(lead, features, two_threads):
    """Output blocks of whole vectors and a tail (37 = 32 + 5 outputs), rows split across two threads (33 rows: one
    padded row; one image of 33 rows split by pixels), against the float64 closed form within float32 rounding."""
    torch.manual_seed(4)
    x = torch.randn(*lead, features, requires_grad=True)
    w = torch.randn(37, features, requires_grad=True)
    y = adder_linear(x, w)
    g = torch.randn_like(y)
    y.backward(g)
    want_y, want_dx, want_dw, _ = _closed_linear(x.detach().double(), w.detach().double(), None, g.double())
    g64 = g.double().abs()
    # a formula: each result is a float32 sum whose terms' absolute values sum to the bound's first argument
    assert ((y.double() - want_y).abs() <= f32_sum_bound(want_y.abs(), features)).all()
    assert ((x.grad.double() - want_dx).abs() <= f32_sum_bound(g64.sum(-1, keepdim=True), 37)).all()
    # the weight gradient is sum g * x - W * sum g (adder2d.grad_weight): terms |g| (|x| + |W|) over the rows
    x64, w64 = x.detach().double().abs(), w.detach().double().abs()
    dw_abs = (g64.unsqueeze(-1) * (x64.unsqueeze(-2) + w64)).reshape(-1, 37, features)
    assert ((w.grad.double() - want_dw).abs() <= f32_sum_bound(dw_abs.sum(0), 2 * dw_abs.shape[0])).all()


def _closed_scores(q, k, g, key_grad):
    d = q.unsqueeze(-2) - k.unsqueeze(-3)  # (..., i, j, c) = q_i - k_j
    s = -d.abs().sum(-1)
    dq = (g.unsqueeze(-1) * (-d).clamp(-1, 1)).sum(-2)
    dk = (g.unsqueeze(-1) * (d.clamp(-1, 1) if key_grad == "hardtanh" else d)).sum(-3)
    return s, dq, dk


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("lead", [(3,), (2, 3)])
@pytest.mark.parametrize("key_grad", ["hardtanh", "full"])
def test_l1_scores_forward_and_gradients_equal_closed_form(backend, lead, key_grad, monkeypatch):
    monkeypatch.setenv("ADDERNET_BACKEND", backend)
    torch.manual_seed(2)
    q = torch.randn(*lead, 5, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(*lead, 6, 4, dtype=torch.float64, requires_grad=True)
    s = l1_scores(q, k, key_grad)
    g = torch.randn_like(s)
    s.backward(g)
    want_s, want_dq, want_dk = _closed_scores(q.detach(), k.detach(), g, key_grad)
    torch.testing.assert_close(s, want_s, rtol=0, atol=1e-12)
    torch.testing.assert_close(q.grad, want_dq, rtol=0, atol=1e-12)
    torch.testing.assert_close(k.grad, want_dk, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("lead", [(5,), (3, 3)])  # odd group counts: two threads get unequal shares of the groups
@pytest.mark.parametrize("key_grad", ["hardtanh", "full"])
@pytest.mark.parametrize("d", [19, 16])  # 16: a multiple of every vector width, the pixels used in place
def test_l1_scores_on_two_threads_equal_closed_form(dtype, lead, key_grad, d, two_threads):
    """The groups (heads) split across two threads in the forward and in both backward kernels; odd sizes (17
    queries, 9 keys, 19 features: vector and pixel-tile tails) against the float64 closed form, float32 within
    its rounding."""
    torch.manual_seed(6)
    q = torch.randn(*lead, 17, d, dtype=dtype, requires_grad=True)
    k = torch.randn(*lead, 9, d, dtype=dtype, requires_grad=True)
    s = l1_scores(q, k, key_grad)
    g = torch.randn_like(s)
    s.backward(g)
    q64, k64, g64 = q.detach().double(), k.detach().double(), g.double()
    want_s, want_dq, want_dk = _closed_scores(q64, k64, g64, key_grad)
    if dtype == torch.float64:  # one rounding order against another: float64 rounding only
        for got, want in ((s, want_s), (q.grad, want_dq), (k.grad, want_dk)):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
        return
    # a formula: float32 sums of d (scores), 9 (query gradient) and 17 terms (key gradient) within the float32
    # bound of their absolute sums; the full key gradient is sum g * q - k * sum g (adder2d.grad_weight)
    assert ((s.double() - want_s).abs() <= f32_sum_bound(want_s.abs(), d)).all()
    assert ((q.grad.double() - want_dq).abs() <= f32_sum_bound(g64.abs().sum(-1, keepdim=True), 9)).all()
    if key_grad == "hardtanh":
        terms = (q64.unsqueeze(-2) - k64.unsqueeze(-3)).abs().clamp(max=1)
    else:
        terms = q64.abs().unsqueeze(-2) + k64.abs().unsqueeze(-3)
    dk_abs = (g64.abs().unsqueeze(-1) * terms).sum(-3)
    assert ((k.grad.double() - want_dk).abs() <= f32_sum_bound(dk_abs, 2 * 17)).all()


@pytest.mark.parametrize("key_grad", ["hardtanh", "full"])
@pytest.mark.parametrize("images", [3, 1])  # 3: the images split across two threads; 1: its heads split
def test_l1_scores_read_the_attention_layout_in_place(key_grad, images, two_threads):
    """q and k as AdderAttention splits a projection into heads: (B, H, N, d) views of memory [B][N][H][d]. The CPU
    kernel takes each image's keys as its own weight and reads them there; the scores and both gradients equal the
    float64 closed form, and the query gradient comes back in the projection's layout."""
    torch.manual_seed(7)
    heads, d = 3, 16
    proj_q = torch.randn(images, 11, heads * d, dtype=torch.float64, requires_grad=True)
    proj_k = torch.randn(images, 7, heads * d, dtype=torch.float64, requires_grad=True)
    q = proj_q.view(images, 11, heads, d).transpose(1, 2)
    k = proj_k.view(images, 7, heads, d).transpose(1, 2)
    s = l1_scores(q, k, key_grad)
    g = torch.randn_like(s)
    s.backward(g)
    want_s, want_dq, want_dk = _closed_scores(q.detach(), k.detach(), g, key_grad)
    torch.testing.assert_close(s, want_s, rtol=0, atol=1e-12)
    torch.testing.assert_close(proj_q.grad, want_dq.transpose(1, 2).reshape(proj_q.shape), rtol=0, atol=1e-12)
    torch.testing.assert_close(proj_k.grad, want_dk.transpose(1, 2).reshape(proj_k.shape), rtol=0, atol=1e-12)


def test_l1_scores_cpu_ops_pass_torch_opcheck():
    """The CPU kernel's ops (a weight per image) agree with their fake implementations and schemas, so torch.compile
    and export can trace them."""
    from addernet.ops.attention import _scores_cpu, _scores_grad_cpu

    q = torch.randn(2, 3, 5, 4).transpose(1, 2).contiguous().transpose(1, 2)
    k, g = torch.randn(2, 3, 6, 4), torch.randn(2, 3, 5, 6)
    torch.library.opcheck(_scores_cpu, (q, k))
    torch.library.opcheck(_scores_grad_cpu, (q, k, g, False))
    torch.library.opcheck(_scores_grad_cpu, (k, q, g, True))


def _reference_attention(m, x):
    """AdderAttention's output by float64 broadcasting from its parameters (projections AdderLinear + LN)."""

    def proj(p, t):
        lin, norm = p[0], p[1]
        y = -(t.unsqueeze(-2) - lin.weight).abs().sum(-1)
        return F.layer_norm(y, y.shape[-1:], norm.weight, norm.bias, norm.eps)

    b, n, dim = x.shape
    heads, dh = m.heads, dim // m.heads
    q, k, v = (proj(p, x).view(b, n, heads, dh).transpose(1, 2) for p in (m.q, m.k, m.v))
    s = -(q.unsqueeze(-2) - k.unsqueeze(-3)).abs().sum(-1) / math.sqrt(dh)
    a = torch.softmax(s, -1)
    o = a @ v if m.value == "product" else -(a.unsqueeze(-1) - v.unsqueeze(-3)).abs().sum(-2)
    if m.identity == "add":
        o = o + v
    return proj(m.out, o.transpose(1, 2).reshape(b, n, dim))


@pytest.mark.parametrize("identity,value", [("add", "product"), ("none", "product"), ("add", "adder")])
def test_adder_attention_equals_broadcast_reference(identity, value):
    torch.manual_seed(3)
    m = AdderAttention(8, heads=2, identity=identity, value=value).double()
    for p in m.parameters():  # move the LayerNorm affines off 1/0 so that they are checked too
        if p.dim() == 1:
            nn.init.normal_(p)
    x = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True)
    y = m(x)
    torch.testing.assert_close(y, _reference_attention(m, x.detach()), rtol=1e-10, atol=1e-10)
    y.square().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0


def test_adder_attention_identity_keeps_the_map_full_rank():
    # all queries and keys equal: softmax(S) is the rank-1 uniform map; A + I has full rank
    m = AdderAttention(4, heads=1).double()
    x = torch.randn(1, 6, 4, dtype=torch.float64)
    a = m.attention_map(x.expand(1, 6, 4)[:, :1].expand(1, 6, 4))[0, 0]
    assert torch.linalg.matrix_rank(a) == 1
    assert torch.linalg.matrix_rank(a + torch.eye(6, dtype=torch.float64)) == 6


def test_adaptive_lr_scales_adder_linear_weights():
    torch.manual_seed(4)
    model = build_model(
        "vit", "adder", num_classes=3, in_channels=1, image_size=8, patch_size=4, width=8, depth=1, heads=2
    )
    alr = AdaptiveLR(model, eta=0.2)
    adder_names = [n for n, m in model.named_modules() if isinstance(m, AdderLinear)]
    assert alr.names == adder_names and len(adder_names) == 6  # q, k, v, out, 2 MLP layers
    model(torch.randn(4, 1, 8, 8)).sum().backward()
    head_grad = model.head.weight.grad.clone()
    alr.apply()
    for n, m in model.named_modules():
        if isinstance(m, AdderLinear):
            k = m.weight.numel()  # a formula: the float32 norm of k squares, in any order
            assert m.weight.grad.norm().item() == pytest.approx(0.2 * math.sqrt(k), rel=f32_sum_bound(1, k)), n
    assert torch.equal(model.head.weight.grad, head_grad)  # multiplicative layers untouched


# ---- adderize


def _conv_names(model):
    return [n for n, m in model.named_modules() if type(m) is nn.Conv2d]


def test_adderize_resnet18_replaces_body_keeps_stem_and_classifier():
    model = torchvision.models.resnet18(num_classes=10)
    convs = {n: m for n, m in model.named_modules() if type(m) is nn.Conv2d}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every adder layer of a ResNet feeds a BatchNorm: no warning
        report = adderize(model)
    modules = dict(model.named_modules())
    assert [n for n, _ in report.replaced] == [n for n in convs if n != "conv1"]
    assert [n for n, _ in report.kept] == ["conv1"]  # fc is no candidate without linear=True
    assert type(modules["conv1"]) is nn.Conv2d and type(modules["fc"]) is nn.Linear
    for name, old in convs.items():
        if name == "conv1":
            continue
        new = modules[name]
        assert type(new) is Adder2d
        assert (
            new.in_channels,
            new.out_channels,
            new.kernel_size,
            new.stride,
            new.padding,
            new.dilation,
            new.groups,
            new.bias is None,
        ) == (
            old.in_channels,
            old.out_channels,
            old.kernel_size,
            old.stride,
            old.padding,
            old.dilation,
            old.groups,
            old.bias is None,
        )
    assert report.missing_norm == [] and report.skipped == []


def test_adderize_switches_first_last_linear_and_patterns():
    model = torchvision.models.resnet18(num_classes=10)
    with pytest.warns(UserWarning, match=r"feed no normalisation layer \(fc\)"):
        report = adderize(model, keep_first=False, keep_last=False, linear=True)
    assert {n for n, _ in report.replaced} >= {"conv1", "fc"} and report.kept == []
    assert type(model.fc) is AdderLinear and type(model.conv1) is Adder2d
    assert report.missing_norm == ["fc"]  # the adder classifier feeds no norm

    model = torchvision.models.resnet18(num_classes=10)
    report = adderize(model, include=["layer4.*"], exclude=["*.downsample.*"])
    assert [n for n, _ in report.replaced] == ["layer4.0.conv1", "layer4.0.conv2", "layer4.1.conv1", "layer4.1.conv2"]
    assert type(model.layer3[0].conv1) is nn.Conv2d and type(model.layer4[0].downsample[0]) is nn.Conv2d


def test_adderize_mobilenet_v2_keeps_groups_and_ends():
    model = torchvision.models.mobilenet_v2(num_classes=10)
    groups = {n: m.groups for n, m in model.named_modules() if type(m) is nn.Conv2d}
    report = adderize(model, linear=True)
    modules = dict(model.named_modules())
    assert [n for n, _ in report.kept] == ["features.0.0", "classifier.1"]
    assert len(report.replaced) == len(groups) - 1 and report.missing_norm == []
    assert any(g > 1 for g in groups.values())
    for name, g in groups.items():
        assert modules[name].groups == g
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def _plain_cnn():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1, bias=True),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 10),
    )


def test_adderize_without_norm_warns_errors_inserts_or_ignores():
    with pytest.warns(UserWarning, match=r"1 adder layer\(s\) feed no normalisation layer \(2\)"):
        report = adderize(_plain_cnn())
    assert report.missing_norm == ["2"] and [n for n, _ in report.replaced] == ["2", "4"]

    with pytest.raises(ValueError, match="missing_norm='insert'"):
        adderize(_plain_cnn(), missing_norm="error")

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        adderize(_plain_cnn(), missing_norm="ignore")
        model = _plain_cnn()
        report = adderize(model, missing_norm="insert")
    assert report.inserted == ["2"]
    assert isinstance(model[2], nn.Sequential) and type(model[2][0]) is Adder2d
    assert isinstance(model[2][1], nn.BatchNorm2d) and model[2][1].num_features == 8
    assert type(model[4]) is Adder2d and model[4].bias is not None  # bias kept, followed by its own BN
    assert model(torch.randn(2, 3, 8, 8)).shape == (2, 10)


def test_adderized_block_equals_hand_built_reference():
    torch.manual_seed(5)
    down = nn.Sequential(nn.Conv2d(64, 128, 1, stride=2, bias=False), nn.BatchNorm2d(128))
    model = nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        torchvision.models.resnet.BasicBlock(64, 128, stride=2, downsample=down),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, 10),
    )
    assert len(adderize(model).replaced) == 3
    model = model.double().eval()
    for m in model.modules():  # non-trivial BN statistics
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.normal_(-300, 50)
            m.running_var.uniform_(1e3, 1e4)
    block = model[3]  # torchvision's BasicBlock, stride 2, with an adder downsample
    x = torch.randn(2, 64, 8, 8, dtype=torch.float64).relu()

    def bn(m, t):
        return F.batch_norm(t, m.running_mean, m.running_var, m.weight, m.bias, False, 0.0, m.eps)

    h = bn(block.bn1, adder2d_reference(x, block.conv1.weight, (2, 2), (1, 1))).relu()
    h = bn(block.bn2, adder2d_reference(h, block.conv2.weight, (1, 1), (1, 1)))
    skip = bn(block.downsample[1], adder2d_reference(x, block.downsample[0].weight, (2, 2), (0, 0)))
    torch.testing.assert_close(block(x), (h + skip).relu(), rtol=1e-10, atol=1e-9)


def test_adderize_rejects_bad_arguments():
    with pytest.raises(TypeError, match="needs a network"):
        adderize(nn.Conv2d(3, 3, 3))
    with pytest.raises(ValueError, match="missing_norm='sometimes' is not valid"):
        adderize(_plain_cnn(), missing_norm="sometimes")
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3),
        nn.Conv2d(4, 4, 3, padding_mode="reflect", padding=1),
        nn.BatchNorm2d(4),
        nn.Flatten(),
        nn.Linear(4, 2),
    )
    with pytest.warns(UserWarning, match="padding_mode='reflect'"):
        report = adderize(model)
    assert report.skipped and report.skipped[0][0] == "1" and type(model[1]) is nn.Conv2d


def test_torchvision_model_builds_twins_and_names_bad_arch():
    adder = build_model("torchvision", "adder", num_classes=7, in_channels=1, arch="resnet18")
    conv = build_model("torchvision", "conv", num_classes=7, in_channels=1, arch="resnet18")
    assert adder.conv1.in_channels == conv.conv1.in_channels == 1 and adder.fc.out_features == 7
    assert {k: v.shape for k, v in adder.state_dict().items()} == {k: v.shape for k, v in conv.state_dict().items()}
    assert not any(isinstance(m, Adder2d) for m in conv.modules())
    with pytest.raises(ValueError, match="did you mean resnet18"):
        build_model("torchvision", arch="resnet81")
    with pytest.raises(ValueError, match="patch_size=5 must divide the image size 32"):
        build_model("vit", image_size=32, patch_size=5)


# ---- op counts and the layers that quantisation / ONNX do not take yet


def test_op_counts_of_adder_linear_and_attention():
    # vit at 8x8 with patch 4: N = 4 tokens, width 8, 2 heads of 4, MLP hidden 16, one block
    kw = dict(num_classes=3, in_channels=1, image_size=8, patch_size=4, width=8, depth=1, heads=2, mlp_ratio=2.0)
    adder, twin = build_model("vit", "adder", **kw), build_model("vit", "conv", **kw)
    body = [n for n, m in adder.named_modules() if isinstance(m, AdderLinear)]
    ra, rc = count_ops(adder, (1, 8, 8)), count_ops(twin, (1, 8, 8), body)
    n, macs = 4, 4 * (8 * 8) + (8 * 16 + 16 * 8)  # per token: q, k, v, out, fc1, fc2
    assert (ra["body"]["mul"], ra["body"]["add"]) == (0, 2 * n * macs)
    assert (rc["body"]["mul"], rc["body"]["add"]) == (n * macs, n * macs + n * (4 * 8 + 16 + 8))  # + biases
    # attention, 2 heads of N x N x 4: L1 scores 2*2*16*4 adds; scale 32 mul; softmax 32 add + 32 mul;
    # A V 128 mul + 128 add; identity 2*4*4 adds
    assert (ra["attention"]["mul"], ra["attention"]["add"]) == (64 + 128, 256 + 32 + 128 + 32)
    assert (rc["attention"]["mul"], rc["attention"]["add"]) == (128 + 64 + 128, 128 + 32 + 128)
    assert ra["residual"]["add"] == 2 * n * 8


def test_quantisation_and_onnx_export_name_the_unsupported_layer():
    kw = dict(num_classes=3, in_channels=1, image_size=8, patch_size=4, width=8, depth=1, heads=2)
    model = build_model("vit", "adder", **kw)
    with pytest.raises(
        ConfigError,
        match=r"ONNX export does not support AdderAttention, AdderLinear layers yet: AdderAttention \(blocks.0.attn\)",
    ):
        onnx_ready(model)
    q = compose(["checkpoint=x.pt"], config_name="test").quant
    q.bits = 8
    with pytest.raises(ConfigError, match=r"quantisation does not support AdderAttention, AdderLinear layers yet"):
        quantize_model(model, None, q)
    onnx_ready(build_model("vit", "conv", **kw))  # the ordinary ViT twin has nothing unsupported


# ---- distillation with model=vit and model=torchvision


def _task(overrides):
    cfg = compose(overrides)
    torch.manual_seed(0)
    task = build_task(model_from_config(cfg), cfg)
    task.to("cpu")
    return task.train(), cfg


@pytest.mark.slow
def test_pkkd_co_trains_the_unconverted_torchvision_network():
    task, cfg = _task(
        [
            "model=torchvision",
            "model.arch=resnet18",
            "data=fake",
            "data.image_size=32",
            "data.batch_size=8",
            "trainer.device=cpu",
            "task=pkkd",
        ]
    )
    assert type(task.teacher.layer1[0].conv1) is nn.Conv2d and type(task.model.layer1[0].conv1) is Adder2d
    assert len(task.layers) == 19  # every adderized layer has its conv twin at the same name
    out = task(torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,)))
    out["loss"].backward()
    assert task.teacher.layer1[0].conv1.weight.grad is not None and task.model.layer1[0].conv1.weight.grad is not None


@pytest.mark.slow
def test_pkkd_names_what_it_cannot_distil_and_kd_takes_any_teacher(tmp_path):
    with pytest.raises(ConfigError, match="AdderLinear / adder attention, which it does not distil yet"):
        _task(TINY_VIT + ["task=pkkd"])
    teacher = build_model("torchvision", "conv", num_classes=10, in_channels=3, arch="resnet18")
    torch.save(teacher.state_dict(), tmp_path / "cnn.pt")
    task, _ = _task(
        TINY_VIT
        + [
            "task=kd",
            f"task.teacher={tmp_path / 'cnn.pt'}",
            "task.teacher_model=torchvision",
            "task.teacher_layer=conv",
        ]
    )
    x = torch.randn(4, 3, 16, 16)
    out = task(x, torch.randint(0, 10, (4,)))
    out["loss"].backward()
    teacher.eval()
    with torch.no_grad():
        want = teacher(x)
    torch.testing.assert_close(task.teacher(x), want)  # the teacher is the saved network, frozen
    assert any(m.weight.grad is not None for m in task.model.modules() if isinstance(m, AdderLinear))


# ---- converter verification: layers the network never calls, networks without adder layers


class _ReadsWeight(nn.Module):
    """A block that calls `body` as a module but reads `proj.weight` itself (as torchvision's Swin does)."""

    def __init__(self):
        super().__init__()
        self.stem, self.body, self.norm = nn.Linear(4, 6), nn.Linear(6, 6), nn.LayerNorm(6)
        self.proj, self.head = nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x):
        h = self.norm(self.body(self.stem(x)))
        return self.head(F.linear(h, self.proj.weight, self.proj.bias))


def test_adderize_puts_back_layers_the_network_does_not_call():
    model = _ReadsWeight()
    proj = model.proj
    with pytest.warns(UserWarning, match=r"1 layer\(s\) stay multiplicative .*\(proj\)"):
        report = adderize(model, linear=True, keep_first=False, example=(2, 4))
    assert [n for n, _ in report.replaced] == ["stem", "body"] and [n for n, _ in report.reverted] == ["proj"]
    assert model.proj is proj and type(model.body) is AdderLinear  # the original module, weights and all
    x = torch.randn(5, 4)
    h = model.norm(adder_linear(adder_linear(x, model.stem.weight, model.stem.bias), model.body.weight))
    torch.testing.assert_close(model(x), model.head(h @ proj.weight.T + proj.bias))
    assert report.missing_norm == ["stem"]  # the reverted layer is no adder layer of the diagnosis

    with pytest.raises(ValueError, match=r"check forward pass on an input of shape \(2, 5\) failed"):
        adderize(_ReadsWeight(), linear=True, example=(2, 5))


def test_torchvision_swin_keeps_the_projections_it_calls_through_their_weight():
    with torch.device("meta"), pytest.warns(UserWarning, match="24 layer"):
        model = build_model("torchvision", arch="swin_t", linear=True, missing_norm="ignore")
    reverted = [n for n, _ in model.adderize_report.reverted]
    assert len(reverted) == 24 and all(n.endswith(("attn.qkv", "attn.proj")) for n in reverted)
    for name, m in model.named_modules():
        assert not isinstance(m, AdderLinear) or "attn" not in name
        if name.endswith(("attn.qkv", "attn.proj")):
            assert type(m) is nn.Linear
    assert sum(isinstance(m, AdderLinear) for m in model.modules()) == len(model.adderize_report.replaced) == 27


@pytest.mark.parametrize(
    "name,options,found",
    [
        ("torchvision", {"arch": "vit_b_16"}, "it has 1 Conv2d, 25 Linear; conv_proj kept"),
        ("torchvision", {"arch": "swin_t"}, "it has 1 Conv2d, 52 Linear; features.0.0 kept"),
        (
            "vit",
            {"scores": "dot", "identity": "none", "proj": "linear", "mlp": "linear"},
            "it has 1 Conv2d, 25 Linear. To train",
        ),
    ],
)
def test_an_adder_model_without_adder_layers_is_an_error(name, options, found):
    with torch.device("meta"), pytest.raises(ValueError, match=f"with layer=adder has no adder layer: {found}"):
        build_model(name, "adder", **options)
    with torch.device("meta"):
        build_model(name, "conv", **options)  # the CNN / plain form is what it is


def test_shape_only_modules_lead_the_norm_diagnosis_to_the_next_layer():
    def block():
        return nn.Sequential(
            nn.Conv2d(3, 8, 3),
            nn.BatchNorm2d(8),
            nn.Conv2d(8, 8, 3, groups=8),  # ConvNeXt's depthwise conv -> Permute -> LayerNorm
            torchvision.ops.Permute([0, 2, 3, 1]),
            nn.LayerNorm(8),
            torchvision.ops.Permute([0, 3, 1, 2]),
            nn.Conv2d(8, 8, 1),  # -> Flatten -> Dropout -> Unflatten -> BatchNorm
            nn.Flatten(2),
            nn.Dropout(),
            nn.Unflatten(2, (4, 4)),
            nn.BatchNorm2d(8),
            nn.Conv2d(8, 8, 1),  # -> Permute -> ReLU: no norm
            torchvision.ops.Permute([0, 2, 3, 1]),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(128, 2),
        )

    with pytest.raises(ValueError, match=r"1 adder layer\(s\) feed no normalisation layer \(11\)"):
        adderize(block(), missing_norm="error")
    report = adderize(model := block(), missing_norm="insert")
    assert report.inserted == ["11"] and [n for n, _ in report.replaced] == ["2", "6", "11"]
    assert model(torch.randn(2, 3, 8, 8)).shape == (2, 2)

    with torch.device("meta"):
        convnext = torchvision.models.convnext_tiny(num_classes=10)
    report = adderize(convnext, missing_norm="ignore")
    dw = [n for n, _ in report.replaced if n.endswith("block.0")]
    assert len(dw) == 18 and not set(dw) & set(report.missing_norm)  # depthwise -> Permute -> LayerNorm
    assert report.missing_norm == ["features.2.1", "features.4.1", "features.6.1"]  # downsample -> adder dwconv


@pytest.mark.parametrize("arch", ["googlenet", "inception_v3"])
def test_torchvision_networks_with_auxiliary_heads_give_logits_in_training(arch):
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torchvision's weight-init notice
        model = build_model("torchvision", "adder", arch=arch).train()
        out = model(torch.empty(2, 3, 224, 224))
    assert isinstance(out, torch.Tensor) and out.shape == (2, 10)


@pytest.mark.parametrize(
    "overrides,match",
    [
        (["model=torchvision", "model.arch=vit_b_16", "model.layer=conv"], "takes 224x224 images only"),
        (["model=vit", "data.image_size=16", "model.image_size=32"], r"built for 32x32 images \(64 patches"),
    ],
)
def test_input_sizes_a_transformer_cannot_take_are_one_line(overrides, match):
    from addernet.engine.config import check_input_size

    cfg = compose(["data=fake", *overrides])
    with pytest.raises(ConfigError, match=match):
        check_input_size(cfg)


def test_torchvision_regnet_builds_on_the_meta_device():
    with torch.device("meta"):
        model = build_model("torchvision", "adder", arch="regnet_x_400mf")
        assert model(torch.empty(2, 3, 32, 32)).shape == (2, 10)


def test_empty_batches_pass_through_adder_linear_attention_and_scores():
    for shape in [(0, 4), (2, 0, 4)]:
        x = torch.randn(shape, requires_grad=True)
        layer, ref = AdderLinear(4, 3, bias=True), nn.Linear(4, 3)
        y = layer(x)
        assert y.shape == ref(x).shape
        y.sum().backward()
        assert torch.equal(x.grad, torch.zeros(shape)) and torch.equal(layer.weight.grad, torch.zeros(3, 4))
    for shape in [(0, 5, 8), (2, 0, 8)]:
        assert AdderAttention(8, 2)(torch.randn(shape)).shape == shape
    q = torch.randn(2, 3, 4)
    assert l1_scores(q[:0], torch.randn(0, 5, 4)).shape == (0, 3, 5)
    assert l1_scores(q[:, :0], torch.randn(2, 5, 4)).shape == (2, 0, 5)
    assert l1_scores(q, torch.randn(2, 0, 4)).shape == (2, 3, 0)
    assert torch.equal(l1_scores(q[..., :0], torch.randn(2, 5, 0)), torch.zeros(2, 3, 5))  # no feature: distance 0


def test_l1_scores_under_autocast_are_float32_like_adder2d():
    q = torch.full((1, 2, 128), 300.0) + torch.randn(1, 2, 128)
    k = torch.full((1, 3, 128), -300.0) + torch.randn(1, 3, 128)  # scores about -76800: beyond float16
    want = -(q.double().unsqueeze(-2) - k.double().unsqueeze(-3)).abs().sum(-1)
    for dtype in (torch.float16, torch.bfloat16):
        with torch.autocast("cpu", dtype=dtype):
            s = l1_scores(q.to(dtype), k.to(dtype))
            y = adder2d(q.to(dtype).view(1, 2, 128, 1).transpose(1, 2), torch.ones(1, 128, 1, 1))
        assert s.dtype == y.dtype == torch.float32 and torch.isfinite(s).all()
        ref = -(q.to(dtype).double().unsqueeze(-2) - k.to(dtype).double().unsqueeze(-3)).abs().sum(-1)
        torch.testing.assert_close(s.double(), ref, rtol=1e-6, atol=0)
    torch.testing.assert_close(l1_scores(q, k).double(), want, rtol=1e-6, atol=0)
