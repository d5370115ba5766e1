"""Triton adder kernels (addernet/ops/kernels/triton.py) against the reference implementation.

On CPU the kernels run through the Triton interpreter in ONE subprocess (TRITON_INTERPRET=1 must
be set before triton decorates them, and must not leak into other tests of this process); its
per-case errors come back as JSON. Every case and tile runs in both dim orders of the register
tile (LANES_FIRST, chosen per Triton version on a GPU). On a CUDA machine the compiled kernels are checked at full
ResNet-20/50 layer shapes, in fp16/bf16, and through the autograd path of addernet.Adder2d.
Reference: adder2d_reference (unfold formulation, Eq. 5/7 backward) in float64.
"""

import importlib
import json
import os
import subprocess
import sys
import zlib

import numpy as np
import pytest
import torch

from addernet.ops.kernels import triton as tk  # the tile lists; kernels only with triton
from addernet.ops.reference import adder2d_reference

from helpers import REPO

try:
    import triton

    HAS_TRITON = True
except ImportError:
    HAS_TRITON = False

# (N, C, H, W, O, kh, kw, stride, padding, dilation, groups, channels_last)
CASES = {
    "odd_3x3_s1_p1": (2, 3, 7, 5, 5, 3, 3, (1, 1), (1, 1), (1, 1), 1, False),
    "s2_p1_g2": (2, 4, 9, 7, 6, 3, 3, (2, 2), (1, 1), (1, 1), 2, False),
    "s2_p0_d2": (1, 3, 8, 9, 4, 3, 3, (2, 2), (0, 0), (2, 2), 1, False),
    "k1_s2": (2, 5, 6, 7, 7, 1, 1, (2, 2), (0, 0), (1, 1), 1, False),
    "k1_s1_g2": (2, 6, 5, 5, 4, 1, 1, (1, 1), (0, 0), (1, 1), 2, False),
    "d2_p2_g2": (1, 6, 7, 7, 4, 3, 3, (1, 1), (2, 2), (2, 2), 2, False),
    "rect_kernel_mixed": (2, 3, 7, 8, 5, 3, 2, (2, 1), (0, 1), (1, 2), 1, False),
    "stride3_small_image": (1, 2, 4, 5, 3, 2, 2, (3, 3), (1, 1), (1, 1), 1, False),
    "channels_last": (2, 4, 6, 5, 6, 3, 3, (1, 1), (1, 1), (1, 1), 1, True),
}
LANES_FIRST_TILE = (2, 2, 32, 1, 1)  # small TN == 1 tile: the lanes-first dim order applies to it
RTOL = 1e-5  # ||out - ref|| / ||ref|| for fp32 kernels against a float64 reference


def _problem(case, dtype=torch.float32, device="cpu", seed=0):
    N, C, H, W, O, kh, kw, s, p, d, g, cl = case
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(N, C, H, W, generator=gen, dtype=torch.float64).to(dtype)
    w = torch.randn(O, C // g, kh, kw, generator=gen, dtype=torch.float64).to(dtype)
    if cl:
        x = x.contiguous(memory_format=torch.channels_last)
    x, w = x.to(device), w.to(device)
    ho, wo = ((size + 2 * p[i] - d[i] * (k - 1) - 1) // s[i] + 1 for i, (size, k) in enumerate(((H, kh), (W, kw))))
    go = torch.randn(N, O, ho, wo, generator=gen, dtype=torch.float64).to(device)
    return x, w, go, (s, p, d, g)


def _reference(x, w, go, conf):
    """float64 forward and input gradient of the reference (Eq. 7 backward)."""
    x64 = x.double().requires_grad_()
    y = adder2d_reference(x64, w.double(), *conf)
    (gx,) = torch.autograd.grad(y, x64, go.double())
    return y.detach(), gx


def _relerr(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    if not torch.isfinite(a).all():
        return float("inf")
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _interpreter_main():
    """Subprocess entry (TRITON_INTERPRET=1): run every case and every tile config, print JSON."""
    assert tk.INTERPRET and tk.available()
    out = {}
    # every case in both dim orders (a TN == 1 tile takes the lanes-first order when asked), then
    # each autotune candidate in both orders
    runs = [(name, case, None, False) for name, case in CASES.items()]
    runs += [(f"{name}_lanes_first", case, LANES_FIRST_TILE, True) for name, case in CASES.items()]
    for cfg in sorted(set(tk._FWD_CONFIGS) | set(tk._DGRAD_CONFIGS)):
        for lf in (False, True):
            runs.append(
                (
                    f"config_{'_'.join(map(str, cfg))}_lf{int(lf)}",
                    (2, 5, 6, 5, 20, 3, 3, (1, 1), (1, 1), (1, 1), 1, False),
                    cfg,
                    lf,
                )
            )
    for name, case, cfg, lf in runs:
        tk.LANES_FIRST = lf
        x, w, go, conf = _problem(case)
        y_ref, gx_ref = _reference(x, w, go, conf)
        res = {}
        if cfg in (None, LANES_FIRST_TILE) or cfg in tk._FWD_CONFIGS:
            y = tk.forward(x, w, *conf, config=cfg)
            res["fwd"] = _relerr(y, y_ref)
            fmt = torch.channels_last if case[-1] else torch.contiguous_format
            res["fwd_layout"] = [list(y.shape) == list(y_ref.shape), y.is_contiguous(memory_format=fmt)]
        if cfg in (None, LANES_FIRST_TILE) or cfg in tk._DGRAD_CONFIGS:
            gx = tk.grad_input(x, w, go.float(), *conf, config=cfg)
            res["dgrad"] = _relerr(gx, gx_ref)
        out[name] = res
    print("JSON:" + json.dumps(out))


@pytest.fixture(scope="module")
def interpreted():
    if not HAS_TRITON:
        pytest.skip("triton is not installed (it ships with CUDA builds of torch)")
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=path, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--interpreter"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode and "only 0-dimensional arrays can be converted" in proc.stderr:
        pytest.skip(
            f"the interpreter of triton {triton.__version__} cannot run loops with runtime bounds under "
            f"numpy {np.__version__} (a known interpreter bug, fixed in triton 3.8): use numpy < 2.4 or "
            "a newer triton to run these tests"
        )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("JSON:")]
    assert proc.returncode == 0 and lines, f"interpreter run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1][5:])


@pytest.mark.integration
@pytest.mark.slow  # the interpreter runs in a subprocess
@pytest.mark.parametrize("order", ["", "_lanes_first"])
@pytest.mark.parametrize("name", list(CASES))
def test_interpreter_forward_and_grad_input_match_reference(interpreted, name, order):
    res = interpreted[name + order]
    assert all(res["fwd_layout"]), res
    assert res["fwd"] < RTOL, f"forward rel. error {res['fwd']:.2e}"
    assert res["dgrad"] < RTOL, f"grad_input rel. error {res['dgrad']:.2e}"


@pytest.mark.integration
@pytest.mark.slow
def test_interpreter_every_autotune_config_is_correct(interpreted):
    cfgs = {k: v for k, v in interpreted.items() if k.startswith("config_")}
    assert len(cfgs) == 2 * len(set(tk._FWD_CONFIGS) | set(tk._DGRAD_CONFIGS)), sorted(cfgs)
    for name, res in cfgs.items():
        for kind, err in res.items():
            if kind in ("fwd", "dgrad"):
                assert err < RTOL, f"{name} {kind} rel. error {err:.2e}"


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_bad_inputs_raise_clear_errors():
    x, w = torch.randn(1, 4, 5, 5), torch.randn(3, 4, 3, 3)
    with pytest.raises(TypeError, match="one float dtype"):
        tk.forward(x, w.double(), (1, 1), (0, 0), (1, 1), 1)
    with pytest.raises(ValueError, match="channel mismatch"):
        tk.forward(x, torch.randn(3, 3, 3, 3), (1, 1), (0, 0), (1, 1), 1)
    with pytest.raises(ValueError, match="too small"):
        tk.forward(torch.randn(1, 4, 2, 2), w, (1, 1), (0, 0), (1, 1), 1)
    with pytest.raises(ValueError, match="grad_out has shape"):
        tk.grad_input(x, w, torch.randn(1, 3, 4, 4), (1, 1), (0, 0), (1, 1), 1)


def _sass_report():
    """addernet.tools.triton_sass_report; skip where this triton cannot compile offline."""
    try:
        mod = importlib.import_module("addernet.tools.triton_sass_report")
    except ImportError as e:
        pytest.skip(f"this triton ({triton.__version__}) has no offline compile API the report uses: {e}")
    if not all(os.path.exists(os.path.join(mod.BIN, tool)) for tool in ("ptxas", "cuobjdump")):
        pytest.skip(f"triton's bundled ptxas/cuobjdump are missing under {mod.BIN}")
    return mod


@pytest.mark.integration
@pytest.mark.codegen
@pytest.mark.slow  # compiles every lanes-along-pixels tile for sm_90 (ptxas): about a minute
@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_sm90_code_of_pixel_lane_tiles_keeps_the_register_tile():
    """The lanes-along-pixels tiles (TN == 1), compiled for sm_90 exactly as a launch would, in the
    dim order this triton gets: no spills, one layout, no layout conversion (a conversion in the
    loop is a shared-memory round trip per step), and an FP-dominated hot loop. This is the codegen
    property the GPU speed rests on; with the wrong dim order triton 3.6 fails all of it."""
    rows = _sass_report().tile_stats(("r20 16->16 32x32", 256, 16, 16, 32, 3, 1, 1), keep=lambda t: t[3] == 1)
    assert {r["kernel"] for r in rows} == {"fwd", "dgrad"}
    for r in rows:
        where = f"{r['kernel']} tile {r['tile']}: {r}"
        assert r["stack"] == 0, "spills: " + where
        assert r["layouts"] == 1 and r["cvt"] == 0 and r["shared"] == 0, "layout round trip: " + where
        assert r["fp"] / r["loop"] >= 0.7, "hot loop not FP-dominated: " + where


# ----------------------------------------------------------------------------------- CUDA
def cuda(test):
    """Marker `cuda` (selected by scripts/gpu_check.sh) plus a skip without a GPU and Triton."""
    return pytest.mark.cuda(
        pytest.mark.skipif(not (HAS_TRITON and torch.cuda.is_available()), reason="needs a CUDA GPU and triton")(test)
    )


# ResNet-20 (CIFAR, 32x32) and ResNet-50 (224x224) adder layer shapes: (Cin, Cout, H, k, stride, pad)
RESNET_LAYERS = {
    "r20_16_32x32": (16, 16, 32, 3, 1, 1),
    "r20_16to32_s2": (16, 32, 32, 3, 2, 1),
    "r20_32_16x16": (32, 32, 16, 3, 1, 1),
    "r20_64_8x8": (64, 64, 8, 3, 1, 1),
    "r20_down_1x1_s2": (32, 64, 16, 1, 2, 0),
    "r50_64_56": (64, 64, 56, 3, 1, 1),
    "r50_128_28": (128, 128, 28, 3, 1, 1),
    "r50_256_14": (256, 256, 14, 3, 1, 1),
    "r50_512_7": (512, 512, 7, 3, 1, 1),
    "r50_128_s2": (128, 128, 56, 3, 2, 1),
    "r50_1x1_256to64": (256, 64, 56, 1, 1, 0),
    "r50_1x1_1024to2048_s2": (1024, 2048, 14, 1, 2, 0),
}


def _cuda_layer(name, batch, dtype):
    cin, cout, h, k, s, p = RESNET_LAYERS[name]
    case = (batch, cin, h, h, cout, k, k, (s, s), (p, p), (1, 1), 1, False)
    return _problem(case, dtype=dtype, device="cuda", seed=zlib.crc32(name.encode()))


@cuda
@pytest.mark.parametrize("name", list(RESNET_LAYERS))
def test_cuda_resnet_shapes_fp32(name):
    x, w, go, conf = _cuda_layer(name, 2, torch.float32)  # full layer shape, small batch: the reference fits
    y_ref, gx_ref = _reference(x, w, go, conf)
    assert _relerr(tk.forward(x, w, *conf), y_ref) < RTOL
    assert _relerr(tk.grad_input(x, w, go.float(), *conf), gx_ref) < RTOL


@cuda
@pytest.mark.parametrize("cfg", sorted(set(tk._FWD_CONFIGS) | set(tk._DGRAD_CONFIGS)))
def test_cuda_every_config_fp32(cfg):
    x, w, go, conf = _cuda_layer("r20_16to32_s2", 3, torch.float32)
    y_ref, gx_ref = _reference(x, w, go, conf)
    assert _relerr(tk.forward(x, w, *conf, config=cfg), y_ref) < RTOL
    if cfg in tk._DGRAD_CONFIGS:
        assert _relerr(tk.grad_input(x, w, go.float(), *conf, config=cfg), gx_ref) < RTOL


@cuda
@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("name", ["r20_32_16x16", "r50_256_14"])  # one 3x3 spec: bounded compiles
def test_cuda_half_precision(name, dtype, tol):
    """Inputs rounded to fp16/bf16, accumulated in fp32: error is the output rounding only."""
    x, w, go, conf = _cuda_layer(name, 2, dtype)
    y_ref, gx_ref = _reference(x, w, go.to(dtype), conf)  # reference on the same rounded inputs
    y = tk.forward(x, w, *conf)
    gx = tk.grad_input(x, w, go.to(dtype), *conf)
    assert y.dtype == dtype and gx.dtype == dtype
    assert _relerr(y, y_ref) < tol
    assert _relerr(gx, gx_ref) < tol


@cuda
def test_cuda_noncontiguous_and_channels_last():
    case = (4, 16, 15, 13, 24, 3, 3, (2, 2), (1, 1), (1, 1), 2, True)  # 3x3 s2 p1: compiled already
    x, w, go, conf = _problem(case, device="cuda", seed=3)
    y_ref, gx_ref = _reference(x, w, go, conf)
    y = tk.forward(x, w, *conf)
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert _relerr(y, y_ref) < RTOL
    go_nc = go.float().transpose(2, 3).contiguous().transpose(2, 3)  # same values, odd strides
    assert _relerr(tk.grad_input(x, w, go_nc, *conf), gx_ref) < RTOL


@cuda
def test_cuda_adder2d_module_autograd_matches_reference():
    """Adder2d on CUDA (fast path: these kernels + the conv weight-gradient identity)."""
    from addernet import Adder2d

    torch.manual_seed(0)
    m = Adder2d(16, 32, 3, stride=2, padding=1, groups=2).cuda()
    x = torch.randn(8, 16, 17, 17, device="cuda", requires_grad=True)
    y = m(x)
    go = torch.randn_like(y)
    y.backward(go)
    x64 = x.detach().double().requires_grad_()
    w64 = m.weight.detach().double().requires_grad_()
    y64 = adder2d_reference(x64, w64, (2, 2), (1, 1), (1, 1), 2)
    y64.backward(go.double())
    assert _relerr(y, y64) < RTOL
    assert _relerr(x.grad, x64.grad) < RTOL
    assert _relerr(m.weight.grad, w64.grad) < RTOL


if __name__ == "__main__" and "--interpreter" in sys.argv:
    _interpreter_main()
