"""Adder2d: fast/eager backends against the unfold reference and against closed-form formulas,
dtypes, errors, torch.compile, compiler fallback and memory bounds."""

import itertools
import json
import os
import random
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from addernet import Adder2d, adder2d
from addernet.ops import BACKENDS as ALL_BACKENDS
from addernet.ops import kernel_in_use, use_backend
from addernet.ops.reference import adder2d_reference

from helpers import REPO, forbid_env_writes

BACKENDS = [b for b in ALL_BACKENDS if b != "reference"]  # compared with the reference


@pytest.fixture
def backend_env(monkeypatch):
    def use(name):
        monkeypatch.setenv("ADDERNET_BACKEND", name)

    return use


def _run(backend_env, backend, x, w, b, conf, gy):
    """Forward and (grad_x, grad_w, grad_b) of one backend."""
    backend_env(backend)
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    b = None if b is None else b.detach().requires_grad_()
    y = adder2d(x, w, b, *conf)
    grads = torch.autograd.grad(y, [t for t in (x, w, b) if t is not None], gy)
    return y.detach(), grads


def _grid():
    rng = random.Random(0)
    for k, s, p, d, g, bias in itertools.product(
        [1, 3, 5, (3, 1)], [1, 2], [0, 1, 2], [1, 2], [1, 2, "cin"], [False, True]
    ):
        kh, kw = (k, k) if isinstance(k, int) else k
        cin = rng.choice([3, 4, 6]) if g == "cin" else 2 * rng.randint(1, 5)
        groups = cin if g == "cin" else g
        cout = groups * rng.randint(1, 3)
        h = max(d * (kh - 1) + 1 - 2 * p, 1) + 2 * rng.randint(0, 2)  # odd/even, always valid
        wd = max(d * (kw - 1) + 1 - 2 * p, 1) + 2 * rng.randint(0, 2) + 1
        yield rng.choice([1, 2, 3]), cin, cout, h, wd, (kh, kw), s, p, d, groups, bias


GRID = list(_grid())


@pytest.mark.parametrize("backend", BACKENDS)
def test_matches_reference_float64_grid(backend, backend_env, one_thread):
    """Forward and all gradients equal the reference over kernel/stride/padding/dilation/groups/bias."""
    torch.manual_seed(0)
    for n, cin, cout, h, wd, k, s, p, d, groups, bias in GRID:
        x = torch.randn(n, cin, h, wd, dtype=torch.float64)
        w = torch.randn(cout, cin // groups, *k, dtype=torch.float64)
        b = torch.randn(cout, dtype=torch.float64) if bias else None
        conf = (s, p, d, groups)
        gy = torch.randn_like(F.conv2d(x, w, None, *conf))  # conv2d has the same shape rules
        y_r, g_r = _run(backend_env, "reference", x, w, b, conf, gy)
        y_f, g_f = _run(backend_env, backend, x, w, b, conf, gy)
        case = f"n={n} cin={cin} cout={cout} hw={h}x{wd} k={k} s={s} p={p} d={d} g={groups} bias={bias}"
        torch.testing.assert_close(y_f, y_r, rtol=1e-11, atol=1e-11, msg=lambda m: f"forward {case}: {m}")
        for name, a, r in zip(("grad_x", "grad_w", "grad_b"), g_f, g_r):
            torch.testing.assert_close(a, r, rtol=1e-11, atol=1e-11, msg=lambda m: f"{name} {case}: {m}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_fast_wide_layers(dtype, layout, backend_env):
    """Channel counts that fill several vector registers (and need output padding), strided
    input layouts and a non-contiguous (expanded) output gradient."""
    torch.manual_seed(1)
    x = torch.randn(3, 40, 9, 11, dtype=dtype)
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    w = torch.randn(72, 20, 3, 3, dtype=dtype)
    gy = torch.randn(1, 72, 1, 1, dtype=dtype).expand(3, 72, 5, 6)
    conf = (2, 1, 1, 2)
    y_r, g_r = _run(backend_env, "reference", x.double(), w.double(), None, conf, gy.double())
    y_f, g_f = _run(backend_env, "fast", x, w, None, conf, gy)
    tol = {"rtol": 1e-5, "atol": 1e-3} if dtype == torch.float32 else {"rtol": 1e-11, "atol": 1e-11}
    torch.testing.assert_close(y_f.double(), y_r, **tol)
    for a, r in zip(g_f, g_r):
        torch.testing.assert_close(a.double(), r, **tol)


@pytest.mark.parametrize("stride", [2, 3, (2, 1)])
def test_fast_strided_pointwise_layer_is_the_same_from_nchw_and_channels_last(stride, backend_env):
    """A strided 1x1 layer on an NCHW input runs at stride 1 on the pixels it reads; a channels-last input is read in
    place. Both sum the same terms in the same order, so float32 results agree bit for bit, and pixels the
    layer skips get an exactly zero input gradient. (The float64 grid above checks the values against the reference.)"""
    torch.manual_seed(2)
    x = torch.randn(3, 24, 18, 20)  # 42 or more output pixels: whole vectors of pixels on every path, and a tail
    w, b = torch.randn(42, 24, 1, 1), torch.randn(42)
    gy = torch.randn_like(F.conv2d(x, w, None, stride))
    nchw = _run(backend_env, "fast", x, w, b, (stride, 0, 1, 1), gy)
    last = _run(backend_env, "fast", x.to(memory_format=torch.channels_last), w, b, (stride, 0, 1, 1), gy)
    assert torch.equal(nchw[0], last[0]) and torch.equal(nchw[1][0], last[1][0])  # y and grad_x: the adder kernels
    torch.testing.assert_close(nchw[1][1], last[1][1])  # grad_w: torch's convolution backward, layouts may round apart
    sh, sw = (stride, stride) if isinstance(stride, int) else stride
    skipped = torch.ones_like(x, dtype=torch.bool)
    skipped[:, :, ::sh, ::sw] = False
    assert nchw[1][0][skipped].eq(0).all() and nchw[1][0][~skipped].ne(0).all()
    assert nchw[1][0].is_contiguous() and last[1][0].is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("cin, width", [(16, 32), (12, 16), (16, 20)])
def test_fast_3x3_layer_is_the_same_from_nchw_and_channels_last(cin, width, backend_env):
    """The forward of a layer of up to 16 channels on NCHW planes runs along the output pixels (whole vectors of a
    row, the rest in the register tiles; a width of 20 takes the tiles only), a channels-last one in the register
    tiles that broadcast each pixel. Both sum the same terms in the same order, so float32 results agree bit for bit
    (the fast path computes an output as sums of min(x, w), patch sums and weight sums, so a different order would
    show in the last bits); the input gradient too."""
    torch.manual_seed(4)
    x = torch.randn(3, cin, 9, width)
    w = torch.randn(20, cin, 3, 3)
    gy = torch.randn_like(F.conv2d(x, w, None, 1, 1))
    nchw = _run(backend_env, "fast", x, w, None, (1, 1, 1, 1), gy)
    last = _run(backend_env, "fast", x.to(memory_format=torch.channels_last), w, None, (1, 1, 1, 1), gy)
    assert torch.equal(nchw[0], last[0]) and torch.equal(nchw[1][0], last[1][0])
    torch.testing.assert_close(nchw[1][1], last[1][1])


def test_fast_float32_rounding_matches_the_reference(backend_env):
    """float32 error of the fast path, measured against float64, stays within a small factor of
    the unfold reference's own float32 error (a long sequential sum, or a rewrite such as
    clamp(w - x) = clamp(w, x - 1, x + 1) - x, is ~10x worse and compounds through BatchNorm in a network). The
    offset inputs make sum x large: the bound the forward's sum of min(x, w) (adder_cpu_body.h) must keep."""
    torch.manual_seed(3)
    x = torch.randn(2, 128, 8, 8, dtype=torch.float64) + 2  # offset inputs: large |x - w| sums
    w = torch.randn(32, 128, 3, 3, dtype=torch.float64)
    gy = torch.randn(2, 32, 8, 8, dtype=torch.float64)
    conf = (1, 1, 1, 1)
    truth = _run(backend_env, "reference", x, w, None, conf, gy)
    errs = {}
    for backend in ("reference", "fast"):
        y, (gx, gw) = _run(backend_env, backend, x.float(), w.float(), None, conf, gy.float())
        errs[backend] = [
            ((a.double() - t).abs().max() / t.abs().max()).item() for a, t in zip((y, gx, gw), (truth[0], *truth[1]))
        ]
    for name, fast, ref in zip(("forward", "grad_input", "grad_weight"), errs["fast"], errs["reference"]):
        assert fast <= 4 * ref + 1e-7, f"{name}: fast float32 error {fast:.2e} vs reference {ref:.2e}"


@pytest.mark.parametrize("openmp", [True, False])
def test_fast_parallel_dispatch(openmp, backend_env, monkeypatch):
    """Both ways of running the C kernel on several threads (torch's OpenMP workers, or the thread
    pool used when the kernel was built without OpenMP) split batches and small images correctly."""
    from addernet.ops.kernels import cpu

    lib = cpu._lib()
    if not openmp:
        monkeypatch.setattr(lib, "adder_openmp", lambda: 0)
    elif not lib.adder_openmp():
        pytest.skip("the C kernel was built without OpenMP here")
    monkeypatch.setattr(cpu, "SERIAL_WORK", 0)
    n = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.manual_seed(5)
        for batch in (1, 5):  # batch < threads splits each image's pixels; otherwise the images
            x = torch.randn(batch, 8, 11, 9, dtype=torch.float64)
            w = torch.randn(12, 8, 3, 3, dtype=torch.float64)
            gy = torch.randn(batch, 12, 11, 9, dtype=torch.float64)
            y_r, g_r = _run(backend_env, "reference", x, w, None, (1, 1, 1, 1), gy)
            y_f, g_f = _run(backend_env, "fast", x, w, None, (1, 1, 1, 1), gy)
            torch.testing.assert_close(y_f, y_r, rtol=1e-12, atol=1e-12)
            for a, r in zip(g_f, g_r):
                torch.testing.assert_close(a, r, rtol=1e-12, atol=1e-12)
    finally:
        torch.set_num_threads(n)


def test_eager_chunks_match_reference(backend_env, monkeypatch):
    """A tiny chunk budget forces the eager backend to split groups, channels, images and rows."""
    from addernet.ops.kernels import eager

    monkeypatch.setattr(eager, "BUDGET", 100)
    torch.manual_seed(7)
    x = torch.randn(3, 6, 9, 7, dtype=torch.float64)
    w = torch.randn(8, 3, 3, 2, dtype=torch.float64)
    gy = torch.randn_like(F.conv2d(x, w, None, 2, 1, 2, 2))
    y_r, g_r = _run(backend_env, "reference", x, w, None, (2, 1, 2, 2), gy)
    y_e, g_e = _run(backend_env, "eager", x, w, None, (2, 1, 2, 2), gy)
    torch.testing.assert_close(y_e, y_r, rtol=1e-12, atol=1e-12)
    for a, r in zip(g_e, g_r):
        torch.testing.assert_close(a, r, rtol=1e-12, atol=1e-12)


def _closed_form(x, w, g, stride, pad):
    """Y, dL/dX and dL/dW by explicit loops over the definition (no unfold, no implementation code)."""
    n_, cin, h, wd = x.shape
    cout, _, kh, kw = w.shape
    xp = torch.zeros(n_, cin, h + 2 * pad, wd + 2 * pad, dtype=x.dtype)
    xp[:, :, pad : pad + h, pad : pad + wd] = x
    ho, wo = g.shape[2:]
    y = torch.zeros(n_, cout, ho, wo, dtype=x.dtype)
    gw = torch.zeros_like(w)
    gxp = torch.zeros_like(xp)
    for n, o, r, c in itertools.product(range(n_), range(cout), range(ho), range(wo)):
        patch = xp[n, :, r * stride : r * stride + kh, c * stride : c * stride + kw]
        y[n, o, r, c] = -(patch - w[o]).abs().sum()
        gw[o] += g[n, o, r, c] * (patch - w[o])  # Eq. 5: full-precision X - W
        gxp[n, :, r * stride : r * stride + kh, c * stride : c * stride + kw] += g[n, o, r, c] * (w[o] - patch).clamp(
            -1, 1
        )  # Eq. 7: HardTanh(W - X)
    return y, gxp[:, :, pad : pad + h, pad : pad + wd], gw


@pytest.mark.parametrize("backend", list(ALL_BACKENDS))
def test_gradients_equal_closed_form(backend, backend_env):
    torch.manual_seed(2)
    x = torch.randn(2, 3, 5, 6, dtype=torch.float64) * 0.7  # |W - X| straddles 1 often
    w = torch.randn(4, 3, 3, 3, dtype=torch.float64) * 0.7
    y_c, gx_c, gw_c = _closed_form(x, w, g := torch.randn(2, 4, 3, 3, dtype=torch.float64), 2, 1)
    y, (gx, gw) = _run(backend_env, backend, x, w, None, (2, 1, 1, 1), g)
    torch.testing.assert_close(y, y_c, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gx, gx_c, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gw, gw_c, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bfloat16_accumulates_in_float32(backend, backend_env):
    """bf16 in, bf16 out, and the only error is the final rounding: a bf16 accumulation over
    K = 576 terms would be far off."""
    backend_env(backend)
    torch.manual_seed(3)
    x = torch.randn(2, 64, 6, 6).bfloat16()
    w = torch.randn(8, 64, 3, 3).bfloat16()
    y = adder2d(x, w, padding=1)
    assert y.dtype == torch.bfloat16
    backend_env("reference")
    exact = adder2d(x.double(), w.double(), padding=1)
    assert ((y.double() - exact).abs() <= exact.abs() * 2**-8 + 1e-6).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_runs_the_layer_in_float32(backend, backend_env, dtype):
    """Under CPU autocast a float32 layer takes low-precision or float32 input and returns float32 (its ~1e4
    outputs must not be rounded before BatchNorm subtracts their mean), equal to the float64 reference of its
    float32 input up to float32 rounding, with float32 parameter gradients."""
    backend_env(backend)
    torch.manual_seed(4)
    layer = Adder2d(16, 8, 3, padding=1, bias=True)
    x = torch.randn(2, 16, 5, 5)
    with torch.autocast("cpu", dtype=dtype):
        y1 = layer(x)
        y2 = layer(x.to(dtype))
    assert y1.dtype == y2.dtype == torch.float32
    y1.sum().backward()
    assert layer.weight.grad.dtype == torch.float32 and layer.bias.grad.dtype == torch.float32
    backend_env("reference")
    ref = adder2d(x.double(), layer.weight.double(), layer.bias.double(), 1, 1)
    torch.testing.assert_close(y1.double(), ref, rtol=1e-6, atol=1e-4)
    ref2 = adder2d(x.to(dtype).double(), layer.weight.double(), layer.bias.double(), 1, 1)
    torch.testing.assert_close(y2.double(), ref2, rtol=1e-6, atol=1e-4)


def test_bad_inputs_raise_clear_errors(backend_env):
    layer = Adder2d(4, 8, 3)
    with pytest.raises(ValueError, match=r"a batch \(N, C, H, W\) or one image \(C, H, W\), got shape \(8, 8\)"):
        layer(torch.randn(8, 8))
    with pytest.raises(ValueError, match=r"got shape \(1, 1, 4, 8, 8\)"):
        layer(torch.randn(1, 1, 4, 8, 8))
    with pytest.raises(ValueError, match="expected input with 4 channels"):
        layer(torch.randn(1, 5, 8, 8))
    with pytest.raises(ValueError, match="smaller than the effective kernel"):
        layer(torch.randn(1, 4, 2, 8))
    with pytest.raises(ValueError, match="divisible by groups"):
        Adder2d(6, 8, 3, groups=4)
    with pytest.raises(ValueError, match="divisible by groups"):
        Adder2d(8, 6, 3, groups=4)
    with pytest.raises(ValueError, match="dividing out_channels"):
        adder2d(torch.randn(1, 4, 5, 5), torch.randn(6, 1, 3, 3), groups=4)
    with pytest.raises(ValueError, match="padding_mode"):
        Adder2d(4, 8, 3, padding_mode="reflect")
    with pytest.raises(ValueError, match="padding='same'"):
        Adder2d(4, 8, 3, padding="same")
    with pytest.raises(ValueError, match="stride"):
        Adder2d(4, 8, 3, stride=0)
    with pytest.raises(TypeError, match="same dtype"):
        layer(torch.randn(1, 4, 5, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="bias must have shape"):
        adder2d(torch.randn(1, 4, 5, 5), torch.randn(8, 4, 3, 3), torch.randn(4))
    backend_env("bogus")
    with pytest.raises(ValueError, match="ADDERNET_BACKEND"):
        layer(torch.randn(1, 4, 5, 5))


def test_use_backend_picks_the_kernels_and_only_reads_the_environment(monkeypatch):
    """use_backend (how a run applies trainer.backend) runs the block's adder layers on its backend, a nested block
    restores the outer choice, and outside any block ADDERNET_BACKEND decides; the variable is never written."""
    from addernet.ops.kernels import cpu, eager

    monkeypatch.setenv("ADDERNET_BACKEND", "eager")
    forbid_env_writes(monkeypatch, "ADDERNET_BACKEND")
    calls = []
    for name, module in (("cpu", cpu), ("eager", eager)):
        monkeypatch.setattr(module, "forward", lambda *a, _n=name, _f=module.forward: calls.append(_n) or _f(*a))
    reference = ALL_BACKENDS["reference"]
    monkeypatch.setitem(ALL_BACKENDS, "reference", lambda *a: calls.append("reference") or reference(*a))
    x, w = torch.randn(1, 2, 4, 4), torch.randn(3, 2, 3, 3)
    with use_backend("fast"):
        adder2d(x, w)
        with use_backend("reference"):
            adder2d(x, w)
            assert kernel_in_use("cpu") == "reference"
        adder2d(x, w)
        assert kernel_in_use("cpu") == "cpu"
    adder2d(x, w)
    assert calls == ["cpu", "reference", "cpu", "eager"]
    assert os.environ["ADDERNET_BACKEND"] == "eager"
    with pytest.raises(ValueError, match="adder backend 'bogus' is not one of fast, eager, reference"):
        with use_backend("bogus"):
            pass


def test_module_matches_conv2d_interface():
    torch.manual_seed(5)
    for args in [(4, 8, 3), (4, 8, (3, 1), 2, (1, 0)), (6, 6, 3, 1, 2, 2, 3, True)]:
        bias = len(args) == 8 and args[7]
        adder, conv = Adder2d(*args[:7], bias=bias), nn.Conv2d(*args[:7], bias=bias)
        x = torch.randn(2, args[0], 9, 10)
        assert adder(x).shape == conv(x).shape
        assert adder.weight.shape == conv.weight.shape
        assert (adder.bias is None) == (conv.bias is None)
    assert (
        repr(Adder2d(4, 8, 3, stride=2, padding=1))
        == "Adder2d(4, 8, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1), bias=False)"
    )
    w = Adder2d(64, 64, 3).weight  # official init N(0, 1)
    assert abs(w.mean().item()) < 0.03 and abs(w.std().item() - 1) < 0.03


@pytest.mark.parametrize("backend", list(ALL_BACKENDS))
def test_empty_batch(backend, backend_env):
    backend_env(backend)
    layer = Adder2d(4, 8, 3, padding=1)
    x = torch.randn(0, 4, 5, 5, requires_grad=True)
    y = layer(x)
    y.sum().backward()
    assert y.shape == (0, 8, 5, 5) and x.grad.shape == x.shape
    assert torch.equal(layer.weight.grad, torch.zeros_like(layer.weight))


@pytest.mark.integration  # torch.compile: inductor's C++ code generation and compilation
@pytest.mark.slow
def test_torch_compile_matches_eager(backend_env):
    backend_env("fast")
    torch.manual_seed(6)
    model = nn.Sequential(Adder2d(3, 8, 3, padding=1, bias=True), nn.ReLU(), Adder2d(8, 4, 3, stride=2)).double()
    x = torch.randn(2, 3, 7, 7, dtype=torch.float64)
    y = model(x)
    y.square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    yc = torch.compile(model, fullgraph=True)(x)
    yc.square().sum().backward()
    torch.testing.assert_close(yc, y, rtol=1e-12, atol=1e-12)
    for p, g in zip(model.parameters(), grads):
        torch.testing.assert_close(p.grad, g, rtol=1e-12, atol=1e-12)


def _subprocess(code, env_extra, timeout=300):
    env = {**os.environ, "PYTHONPATH": str(REPO), **env_extra}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=timeout,
    )


@pytest.mark.slow
def test_eager_fallback_when_compiler_missing(tmp_path):
    code = """
        import torch, warnings
        from addernet import adder2d
        import importlib
        mod = importlib.import_module("addernet.ops.adder2d")
        torch.manual_seed(0)
        x, w = torch.randn(2, 4, 6, 6, dtype=torch.float64), torch.randn(5, 4, 3, 3, dtype=torch.float64)
        y = adder2d(x, w, padding=1); adder2d(x, w)  # second call must not warn again
        assert mod._cpu_kernels() is mod.eager, mod._cpu_kernels()
        mod.os.environ["ADDERNET_BACKEND"] = "reference"
        torch.testing.assert_close(y, adder2d(x, w, padding=1), rtol=1e-12, atol=1e-12)
        print("OK")
    """
    res = _subprocess(
        code,
        {
            "CC": str(tmp_path / "no-such-cc"),
            "ADDERNET_CACHE_DIR": str(tmp_path / "cache"),
            "ADDERNET_BACKEND": "fast",
            "PYTHONWARNINGS": "default",
        },
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "OK"
    warned = [
        line for line in res.stderr.splitlines() if "Warning: addernet:" in line
    ]  # the message, not its source line
    assert len(warned) == 1 and "eager" in warned[0] and "no-such-cc" in warned[0], res.stderr


@pytest.mark.integration
@pytest.mark.slow
def test_kernel_cache_reused(tmp_path):
    code = """
        from addernet.ops.kernels import build
        build.load_library()
        print(sorted(p.name for p in build.cache_dir().iterdir()))
    """
    env = {"ADDERNET_CACHE_DIR": str(tmp_path)}
    first = _subprocess(code, env)
    assert first.returncode == 0, first.stderr
    names = json.loads(first.stdout.strip().replace("'", '"'))
    assert len(names) == 1 and names[0].startswith("adder_cpu_") and names[0].endswith(".so")
    mtime = (tmp_path / names[0]).stat().st_mtime_ns
    second = _subprocess(code, env)
    assert second.stdout == first.stdout and (tmp_path / names[0]).stat().st_mtime_ns == mtime


@pytest.mark.slow
def test_peak_memory_bounded_where_reference_needs_gigabytes():
    """fwd+bwd of a layer whose reference would materialise > 1 GB per temporary: the peak RSS
    rise (all allocations, measured in a fresh process) stays a small multiple of the activation."""
    n, c, hw, k = 16, 64, 32, 3
    reference_bytes = n * c * (c * k * k) * hw * hw * 4  # one N x Cout x K x L float32 block
    assert reference_bytes > 2**30
    code = f"""
        import ctypes, gc, json, os, torch
        from addernet import Adder2d
        ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 16)  # freed blocks go back to the OS
        def status(key):
            return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key))
        out = {{}}
        for backend in ("fast", "conv"):
            os.environ["ADDERNET_BACKEND"] = "fast" if backend == "conv" else backend
            layer = (torch.nn.Conv2d if backend == "conv" else Adder2d)({c}, {c}, {k}, padding=1, bias=False)
            warm = torch.randn(2, {c}, 8, 8, requires_grad=True)
            layer(warm).sum().backward()  # load kernels, start threads
            x = torch.randn({n}, {c}, {hw}, {hw}, requires_grad=True)
            g = torch.randn({n}, {c}, {hw}, {hw})
            gc.collect()
            open("/proc/self/clear_refs", "w").write("5")
            base = status("VmRSS")
            layer(x).backward(g)
            out[backend] = status("VmHWM") - base
            del x, g, layer, warm
        print(json.dumps(out))
    """
    res = _subprocess(code, {})
    assert res.returncode == 0, res.stderr
    peaks = json.loads(res.stdout.strip().splitlines()[-1])
    act = n * c * hw * hw * 4
    # y, grad_x, grad_w, library workspaces: a few activations, like nn.Conv2d (peaks["conv"])
    assert peaks["fast"] < 6 * act, (peaks, act)


@pytest.mark.parametrize("backend", list(ALL_BACKENDS))
def test_one_unbatched_image_as_conv2d_takes_it(backend, backend_env):
    """A (C, H, W) input gives (O, H', W'), the shape nn.Conv2d gives it, with the values and gradients of the same
    image as a batch of one, which the closed form checks."""
    backend_env(backend)
    torch.manual_seed(7)
    layer, conv = Adder2d(3, 4, 3, stride=2, padding=1, bias=True).double(), nn.Conv2d(3, 4, 3, 2, 1).double()
    with torch.no_grad():
        layer.bias.copy_(torch.randn(4))
    x = torch.randn(3, 5, 6, dtype=torch.float64, requires_grad=True)
    y = layer(x)
    assert y.shape == conv(x).shape == (4, 3, 3)
    g = torch.randn_like(y)
    gx, gw, gb = torch.autograd.grad(y, [x, layer.weight, layer.bias], g)
    y_c, gx_c, gw_c = _closed_form(x.detach()[None], layer.weight.detach(), g[None], 2, 1)
    torch.testing.assert_close(y.detach(), y_c[0] + layer.bias.detach().view(-1, 1, 1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gx, gx_c[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gw, gw_c, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gb, g.sum((1, 2)), rtol=1e-12, atol=1e-12)
    batched = layer(x.detach()[None])
    assert torch.equal(y.detach(), batched[0].detach())


@pytest.mark.parametrize("backend", ["fast", "eager"])
def test_the_gradient_ops_pass_torch_opcheck(backend):
    """The custom ops' fake implementations (torch.compile) and schemas agree with their kernels: the input gradient
    alone, and with the weight gradient's product term (summed by the CPU kernel's input-gradient pass)."""
    from addernet.ops.adder2d import _grad_input_op, _grad_input_weight_op

    torch.manual_seed(0)
    x, w = torch.randn(2, 6, 7, 7), torch.randn(8, 3, 3, 3)
    g = torch.randn(2, 8, 4, 4)
    conf = ([2, 2], [1, 1], [1, 1], 2, backend)
    torch.library.opcheck(_grad_input_op, (x, w, g, *conf))
    torch.library.opcheck(_grad_input_weight_op, (x, w, g, *conf))


def test_the_weight_gradient_is_the_same_summed_in_the_input_gradient_or_apart(monkeypatch):
    """A weight over FUSED_WEIGHT_BYTES gets its weight gradient from the convolution weight gradient instead of the
    input-gradient kernel's sums: both equal the float64 reference, on NCHW, channels-last and a strided 1x1."""
    from addernet.ops.kernels import cpu

    monkeypatch.setenv("ADDERNET_BACKEND", "fast")
    torch.manual_seed(0)
    for (cin, cout, k, s, p), layout in itertools.product(
        [(12, 20, 3, 1, 1), (16, 24, 1, 2, 0)], [torch.contiguous_format, torch.channels_last]
    ):
        x = torch.randn(3, cin, 9, 9, dtype=torch.float64)
        w = torch.randn(cout, cin, k, k, dtype=torch.float64)
        gy = torch.randn_like(F.conv2d(x, w, None, s, p))
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        want = torch.autograd.grad(adder2d_reference(xr, wr, (s, s), (p, p)), (xr, wr), gy)
        for fused_bytes in (1 << 20, 0):
            monkeypatch.setattr(cpu, "FUSED_WEIGHT_BYTES", fused_bytes)
            xf = x.to(torch.float32, memory_format=layout).requires_grad_()
            wf = w.float().requires_grad_()
            got = torch.autograd.grad(adder2d(xf, wf, None, s, p), (xf, wf), gy.float())
            for a, b in zip(got, want):
                torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5 * b.abs().max().item())
