"""Post-training quantisation (addernet/quant): the quantiser's identities, the integer kernel against an
integer reference, grouping against brute force, the quantised layer's two paths, checkpoints, errors."""

import itertools

import numpy as np
import pytest
import torch

from addernet.checkpoint import CheckpointError
from addernet.engine import ConfigError
from addernet.models import build_model
from addernet.ops import Adder2d, AdderLinear
from addernet.ops.reference import adder2d_reference
from addernet.quant import QAdder2d, load_quantized_into, quantize_model, save_quantized
from addernet.quant.convert import check_supported, quantize_layer
from addernet.quant.grouping import group_filters, kmeans_1d
from addernet.quant.quantizer import (
    clamp_weight,
    group_scales,
    lane,
    levels,
    quantize_activation,
    quantize_weight,
    unsigned_form,
)

from helpers import int_reference, quant_cfg

# ---- quantiser identities ----------------------------------------------------------------------------------


@pytest.mark.parametrize("grid", ["signed", "unsigned"])
def test_weight_clamp_with_bias_is_exact_within_the_range_and_not_beyond(grid):
    """signed: exact for x in [-A, A]; unsigned (weights in [0, A]): exact for x in [0, A], not for x < 0."""
    g = torch.Generator().manual_seed(0)
    a = 1.5
    w = torch.randn(6, 4, 3, 3, generator=g, dtype=torch.float64) * 3  # most |w| > A
    clamped, beta = clamp_weight(w, a, grid)
    assert clamped.max() <= a and clamped.min() >= (0 if grid == "unsigned" else -a) and (beta < 0).all()

    def err(x):
        got = adder2d_reference(x, clamped, (1, 1), (0, 0)) + beta.view(1, -1, 1, 1)
        return (got - adder2d_reference(x, w, (1, 1), (0, 0))).abs().max().item()

    for low in (0.0, -a):  # x in [0, A] and in [-A, A]
        x = low + (a - low) * torch.rand(2, 4, 7, 7, generator=g, dtype=torch.float64)
        assert err(x) < 1e-12 if (low == 0 or grid == "signed") else err(x) > 0.1
    assert err(torch.full((1, 4, 3, 3), 3 * a, dtype=torch.float64)) > 1  # beyond A the identity fails


@pytest.mark.parametrize("grid", ["signed", "unsigned"])
@pytest.mark.parametrize("bits", [8, 6, 5, 4])
def test_integer_form_equals_the_dequantised_float_form(bits, grid):
    """-sum|x_hat - w_hat| = -(s / (2^b-1)) sum|q_a - 2 q_w| (signed grid) or sum|q_a - q_w| (unsigned grid): the
    integer identity, in float64; the weights use the b-bit range of their grid and no more."""
    g = torch.Generator().manual_seed(bits)
    s, lv = 0.8, levels(bits)
    x = torch.rand(3, 5, 6, 6, generator=g, dtype=torch.float64) * 1.2  # some beyond s: clipped
    w = (torch.rand(4, 5, 3, 3, generator=g, dtype=torch.float64) * 2 - 1) * s
    w = w.clamp(min=0) if grid == "unsigned" else w
    qa = quantize_activation(x, s, bits)
    qw = quantize_weight(w, torch.full((4,), s, dtype=torch.float64), bits, grid)
    low, high = (0, lv) if grid == "unsigned" else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    assert qa.min() >= 0 and qa.max() <= lv and qw.min() >= low and qw.max() <= high
    step = {"signed": 2, "unsigned": 1}[grid]
    dequant = adder2d_reference(qa * s / lv, qw * step * s / lv, (1, 1), (1, 1))
    integer = -(s / lv) * int_reference(qa.long(), (step * qw).long(), (1, 1), (1, 1), (1, 1), 1).double()
    torch.testing.assert_close(dequant, integer, rtol=0, atol=1e-10)
    # the grid's step: half a step of the signed grid is the most any weight in [0, s] moves on the unsigned one
    assert (qw * step * s / lv - w).abs().max() <= step * s / lv / 2 + 1e-12


def test_rounding_is_half_to_even():
    """Pinned (torch.round, half to even): x (2^b-1)/s = 2.5 -> 2, 3.5 -> 4."""
    lv = levels(4)
    q = quantize_activation(torch.tensor([2.5, 3.5]) / lv, 1.0, 4)
    assert q.tolist() == [2.0, 4.0]


def test_group_scales_are_the_activation_range_or_the_group_max():
    w = torch.tensor([0.5, -0.7, 3.0, 5.0]).view(4, 1, 1, 1)
    group = torch.tensor([0, 0, 1, 1])
    assert group_scales(w, group, 2, act_range=2.0).tolist() == pytest.approx([0.7, 2.0])


# ---- grouping ----------------------------------------------------------------------------------------------


def _sse(values, labels):
    return sum(((values[labels == c] - values[labels == c].mean()) ** 2).sum() for c in set(labels.tolist()))


def test_kmeans_1d_is_the_optimum_of_every_assignment():
    rng = np.random.default_rng(0)
    for n, k in ((7, 3), (8, 2), (6, 4)):
        v = rng.gamma(2.0, 1.0, n)
        labels = kmeans_1d(v, k)
        best = min(_sse(v, np.array(a)) for a in itertools.product(range(k), repeat=n) if len(set(a)) == k)
        assert len(set(labels.tolist())) == k
        assert _sse(v, labels) == pytest.approx(best, rel=1e-12)
        means = [v[labels == c].mean() for c in range(k)]
        assert means == sorted(means)  # groups numbered by ascending max|w|


def test_grouping_deterministic_sorted_and_not_worse_than_sklearn():
    sklearn = pytest.importorskip("sklearn")
    assert sklearn
    w = torch.randn(64, 16, 3, 3, generator=torch.Generator().manual_seed(3)) * torch.linspace(0.2, 3, 64).view(
        -1, 1, 1, 1
    )
    feature = w.abs().flatten(1).amax(1).double().numpy()
    ours = group_filters(w, 4)
    assert torch.equal(ours, group_filters(w.clone(), 4))
    for method in ("kmeans", "kmeans_sklearn"):
        labels = group_filters(w, 4, method, seed=0)
        maxes = [feature[labels.numpy() == c].max() for c in range(4)]
        mins = [feature[labels.numpy() == c].min() for c in range(4)]
        assert all(maxes[c] < mins[c + 1] for c in range(3))  # contiguous groups, ascending
    assert _sse(feature, ours.numpy()) <= _sse(feature, group_filters(w, 4, "kmeans_sklearn", 0).numpy()) + 1e-12


# ---- integer kernel ----------------------------------------------------------------------------------------

CASES = [  # (N, C, H, W, O, kernel, stride, padding, dilation, groups)
    (2, 16, 9, 7, 5, (3, 3), (1, 1), (1, 1), (1, 1), 1),
    (3, 6, 8, 8, 6, (3, 3), (2, 2), (1, 1), (1, 1), 2),
    (1, 3, 5, 6, 7, (1, 1), (1, 1), (0, 0), (1, 1), 1),
    (2, 64, 8, 8, 64, (3, 3), (1, 1), (1, 1), (1, 1), 1),
    (1, 8, 11, 10, 9, (3, 2), (2, 1), (0, 2), (2, 1), 1),
    (5, 32, 16, 16, 64, (1, 1), (2, 2), (0, 0), (1, 1), 1),
    (1, 12, 7, 7, 12, (3, 3), (1, 1), (1, 1), (1, 1), 3),
]


@pytest.mark.parametrize("lane", [torch.uint8, torch.uint16])
@pytest.mark.parametrize("case", CASES)
def test_integer_kernel_equals_the_integer_reference(case, lane):
    from addernet.ops.kernels import int_cpu

    n, c, h, wd, o, k, s, p, d, groups = case
    top = 256 if lane == torch.uint8 else 65536
    g = torch.Generator().manual_seed(hash(case) % 1000)
    x = torch.randint(0, top, (n, c, h, wd), generator=g, dtype=torch.int32)
    w = torch.randint(0, top, (o, c // groups, *k), generator=g, dtype=torch.int32)
    y = int_cpu.forward(x.to(lane), w.to(lane), s, p, d, groups)
    assert y.dtype == torch.int32
    assert torch.equal(y.long(), int_reference(x, w, s, p, d, groups))


def test_integer_kernel_rejects_signed_or_mixed_dtypes():
    from addernet.ops.kernels import int_cpu

    with pytest.raises(TypeError, match="uint8 or uint16"):
        int_cpu.forward(torch.zeros(1, 2, 4, 4, dtype=torch.int8), torch.zeros(1, 2, 1, 1, dtype=torch.int8))


# ---- the quantised layer -----------------------------------------------------------------------------------


@pytest.mark.parametrize("grid", ["signed", "unsigned"])
@pytest.mark.parametrize("bits", [8, 6, 5, 4, 12])
@pytest.mark.parametrize("conf", [dict(stride=1, padding=1, groups=1), dict(stride=2, padding=0, groups=2)])
def test_qadder_integer_path_matches_float_path_and_an_independent_reference(bits, conf, grid):
    g = torch.Generator().manual_seed(bits)
    adder = Adder2d(8, 12, 3, stride=conf["stride"], padding=conf["padding"], groups=conf["groups"])
    with torch.no_grad():
        adder.weight.copy_(torch.randn(adder.weight.shape, generator=g) * torch.linspace(0.1, 2, 12).view(-1, 1, 1, 1))
    x = torch.rand(3, 8, 9, 9, generator=g) * 1.3
    q = quantize_layer(adder, act_range=1.0, bits=bits, n_groups=3, grid=grid)
    q.kernel = "int"
    y_int = q(x)
    q.kernel = "fake"
    y_fake = q(x)
    torch.testing.assert_close(y_int, y_fake, rtol=1e-5, atol=1e-5 * y_fake.abs().max().item())
    # independent: per filter, its group's scale, integer sum from the unfold reference
    lv, want = levels(bits), torch.empty_like(y_int, dtype=torch.float64)
    cg, og = 8 // conf["groups"], 12 // conf["groups"]
    for o in range(12):
        s = q.scale[q.group[o]].double()
        qa = (x.double() * (lv / s)).round().clamp(0, lv).long()
        h = o // og
        step = {"signed": 2, "unsigned": 1}[grid]
        total = int_reference(
            qa[:, h * cg : (h + 1) * cg], step * q.qweight[o : o + 1].long(), adder.stride, adder.padding, (1, 1), 1
        )
        want[:, o] = (-(s / lv) * total.double() + q.bias_term[o].double())[:, 0]
    torch.testing.assert_close(y_int.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def test_qadder_is_close_to_the_float_layer_at_8_bits_for_inputs_within_range():
    g = torch.Generator().manual_seed(0)
    adder = Adder2d(16, 16, 3, padding=1)
    with torch.no_grad():
        adder.weight.mul_(0.5)
    x = torch.rand(2, 16, 8, 8, generator=g)
    q = quantize_layer(adder, act_range=1.0, bits=8, n_groups=4)
    y, yq = adder(x), q(x)
    assert ((yq - y).abs().max() / y.abs().max()).item() < 0.01


# ---- model, checkpoint, errors -----------------------------------------------------------------------------


def _tiny_loader(n=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(n, 3, 32, 32, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images, torch.zeros(n)), batch_size=8)


@pytest.mark.parametrize("grid", ["signed", "unsigned"])
def test_quantize_model_swaps_every_adder_layer_and_keeps_stem_and_classifier(tmp_path, grid):
    torch.manual_seed(0)
    model = build_model("resnet20").eval()
    ref = build_model("resnet20").eval()
    ref.load_state_dict(model.state_dict())
    quantize_model(model, _tiny_loader(n=8), quant_cfg(bits=8, groups=2, weight_grid=grid))  # one batch is enough
    assert not any(isinstance(m, Adder2d) for m in model.modules())
    assert sum(isinstance(m, QAdder2d) for m in model.modules()) == 20  # 18 3x3 + 2 downsample 1x1
    assert torch.equal(model.conv1.weight, ref.conv1.weight) and torch.equal(model.fc.weight, ref.fc.weight)
    x = next(iter(_tiny_loader(seed=1)))[0]
    with torch.no_grad():
        y = model(x)
    path = save_quantized(tmp_path / "q.pt", model, {"model": {"name": "resnet20"}}, {"bits": 8})
    raw = torch.load(path, weights_only=True)
    want = {"signed": torch.int8, "unsigned": torch.uint8}[grid]
    assert raw["quant"] == {"bits": 8} and raw["model"]["layer1.0.conv1.qweight"].dtype == want
    loaded, _ = load_quantized_into(build_model("resnet20").eval(), path)
    with torch.no_grad():
        assert torch.equal(loaded(x), y)  # determinism: the saved model and the loaded one, on this machine
    with pytest.raises(CheckpointError, match="do not match"):
        load_quantized_into(build_model("resnet32"), path)


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(bits=1), "quant.bits=1"),
        (dict(bits=17), "quant.bits=17"),
        (dict(bits="8"), "quant.bits='8'"),
        (dict(bits=8, groups=17), "quant.groups=17"),
    ],
)
def test_bad_settings_are_config_errors(bad, match):
    with pytest.raises(ConfigError, match=match) as e:
        quantize_model(build_model("resnet20"), _tiny_loader(), quant_cfg(**bad))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("grid", ["signed", "unsigned"])
@pytest.mark.parametrize("conf", [dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=1, stride=2, padding=0)])
def test_onnx_quantised_layer_equals_qadder_exactly(tmp_path, conf, grid):
    """One quantised layer through onnxruntime: the same values as the integer kernel, bit for bit."""
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from addernet.quant.onnx import OnnxQAdder2d, export_onnx

    g = torch.Generator().manual_seed(1)
    adder = Adder2d(16, 32, **conf)
    x = torch.rand(3, 16, 8, 8, generator=g) * 1.5
    q = quantize_layer(adder, act_range=1.0, bits=8, n_groups=4, grid=grid).eval()
    path = export_onnx(torch.nn.Sequential(q), tmp_path / "layer.onnx", x[:1])
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"images": x.numpy()})[0]
    # exact on any CPU: integer sums, then the same float32 scaling in both (one IEEE rounding each)
    assert torch.equal(torch.from_numpy(got), q(x))
    assert torch.equal(OnnxQAdder2d(q)(x), q(x))


@pytest.mark.parametrize("grid", ["signed", "unsigned"])
@pytest.mark.parametrize("bits", [2, 8, 9, 16])
def test_unsigned_form_is_exact_for_non_negative_activations_and_fits_its_lane(bits, grid):
    """sum |q_a - v| = sum |q_a - u| + c for every q_a in [0, 2^b - 1], v the weights in activation steps (2 q_w on
    the signed grid, q_w on the unsigned one), with u stored losslessly in lane(bits)."""
    g = torch.Generator().manual_seed(bits)
    if grid == "signed":
        v = 2 * torch.randint(-(2 ** (bits - 1)), 2 ** (bits - 1), (6, 2, 3, 3), generator=g)
    else:
        v = torch.randint(0, 2**bits, (6, 2, 3, 3), generator=g)
    q_a = torch.randint(0, 2**bits, (50, 1, 2, 3, 3), generator=g)
    u, c = unsigned_form(v)
    assert torch.equal((q_a - v).abs().flatten(2).sum(2), (q_a - u).abs().flatten(2).sum(2) + c)
    assert grid == "signed" or (c == 0).all()
    assert lane(bits) == (torch.uint8 if bits <= 8 else torch.uint16)
    assert torch.equal(u.to(lane(bits)).to(torch.int64), u) and torch.equal(q_a.to(lane(bits)).to(torch.int64), q_a)


def test_check_supported_names_the_layers_quantisation_cannot_handle():
    net = torch.nn.Sequential(Adder2d(3, 4, 3), torch.nn.Flatten(), AdderLinear(4, 2))
    with pytest.raises(ConfigError, match=r"ONNX export does not support AdderLinear layers yet: AdderLinear \(2\)"):
        check_supported(net, "ONNX export")
    check_supported(torch.nn.Sequential(Adder2d(3, 4, 3)), "quantisation")  # Adder2d alone is handled


def test_a_quantised_file_from_before_the_unsigned_grid_loads_as_the_signed_grid(tmp_path):
    """A file without the weight_step buffers (written before it existed) is AdderQuant's signed grid."""
    torch.manual_seed(0)
    model = quantize_model(build_model("resnet20").eval(), _tiny_loader(n=8), quant_cfg(bits=8, weight_grid="signed"))
    path = save_quantized(tmp_path / "q.pt", model, {"model": {"name": "resnet20"}}, {"bits": 8})
    raw = torch.load(path, weights_only=True)
    raw["model"] = {k: v for k, v in raw["model"].items() if not k.endswith(".weight_step")}
    torch.save(raw, tmp_path / "old.pt")
    loaded, _ = load_quantized_into(build_model("resnet20").eval(), tmp_path / "old.pt")
    x = next(iter(_tiny_loader(seed=1)))[0]
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    assert {m.grid for m in loaded.modules() if isinstance(m, QAdder2d)} == {"signed"}


def test_qadder_gives_nan_for_non_finite_inputs_only_and_not_for_huge_finite_ones():
    """A sample holding NaN or inf gives NaN; one whose finite values sum beyond float32 (3e38 each) is clipped
    to the top level like any value above the range, and stays finite."""
    g = torch.Generator().manual_seed(0)
    q = quantize_layer(Adder2d(4, 6, 3, padding=1), act_range=1.0, bits=8, n_groups=2)
    x = torch.rand(4, 4, 5, 5, generator=g)
    x[1] = 3e38
    x[2, 0, 0, 0] = float("nan")
    x[3, 1, 2, 2], x[3, 2, 2, 2] = float("inf"), float("-inf")
    y = q(x)
    assert torch.isfinite(y[:2]).all() and torch.isnan(y[2:]).all()
    torch.testing.assert_close(y[1], q(torch.ones(1, 4, 5, 5))[0])  # clipped at the range, as 1.0 is
