"""Triton kernels for the adder convolution on CUDA: forward and input gradient.

Both are implicit GEMMs on CUDA cores (no im2col buffer, no tensor cores: |x - w| is not a
product).  A program owns an output tile of BM pixels x BN channels held in fp32 registers as
a 4-D block of the register dims RM, RN and the lane dims TM, TN: each thread keeps RM x RN
accumulators (pixel m = rm*TM + tm, channel n = rn*TN + tn) and the TM x TN threads tile the
block.  Written this way Triton's layout gives every thread a register tile, so the inner loop
over the reduction (input channel c at kernel tap i, j) is RM + RN loads and 2*RM*RN FADDs
(x - w, then acc + |.| with the abs folded into the add): the rank-1 update of a CUDA-core GEMM.
Which dim order gets lanes on TM / TN depends on how Triton's layout passes break ties between
dims of equal contiguity (the pixel loads have none provable), so the block's dim order follows
the installed Triton (LANES_FIRST below): from 3.7 on the lane dims come last, [RN, RM, TN, TM]
(checked on 3.8; 3.7 is not checked); before 3.7 they come first, [TM, TN, RM, RN], for the
TN == 1 tiles (checked on 3.6, where the other order spills and moves every input-gradient step
through shared memory).  Both orders are compiled and checked offline on sm_90 SASS by
scripts/triton_sass_report.py (one layout, no spills, no shared-memory round trip in the loop
for the TN == 1 tiles).

Padding is handled without masked loads in the loop: addresses are clamped into the image
and the loaded value replaced by 0 outside it (zero padding counts as x = 0).

Input gradient (Eq. 7): dX[n,c,h,w] = sum over the (o, i, j) whose output touches (h, w) of
g * clamp(w - x, -1, 1), gathered (no atomics, deterministic).  Pixels are grouped by their
residue modulo the stride so a program only visits the kernel taps that hit its pixels.
clamp(w - x, -1, 1) = 2u - 1 with u = sat(w' - x/2), w' = w/2 + 1/2 precomputed, so the loop
is one saturating add and one FMA per element; sum(g) is subtracted at the end.

Indices: pixel and channel offsets are int32 inside an image; the image base is int64, so
tensors with more than 2**31 elements work as long as one image has fewer.
"""

import inspect
import os
import re
from contextlib import nullcontext as _nullcontext
from typing import NamedTuple

import torch

from ..conv_args import check_grad_out, check_inputs, out_hw, output_format

try:
    import triton
    import triton.language as tl
except ImportError:  # triton ships with CUDA builds of torch; without it the op falls back
    triton = None

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


def available():
    """True when the kernels can run: triton importable and a CUDA GPU (or the interpreter)."""
    if triton is None:
        return False
    if INTERPRET:
        return True
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (7, 5)


if triton is not None:

    @triton.jit
    def _tile_offsets(m0, n0, RM: tl.constexpr, RN: tl.constexpr, TM: tl.constexpr, TN: tl.constexpr, LF: tl.constexpr):
        # LF (lanes first): dims [TM, TN, RM, RN], else [RN, RM, TN, TM]; see the module docstring
        if LF:
            m = m0 + tl.arange(0, TM)[:, None, None, None] + tl.arange(0, RM)[None, None, :, None] * TM
            n = n0 + tl.arange(0, TN)[None, :, None, None] + tl.arange(0, RN)[None, None, None, :] * TN
        else:
            m = m0 + tl.arange(0, RM)[None, :, None, None] * TM + tl.arange(0, TM)[None, None, None, :]
            n = n0 + tl.arange(0, RN)[:, None, None, None] * TN + tl.arange(0, TN)[None, None, :, None]
        return m, n

    @triton.jit
    def _fwd_kernel(
        x_ptr,
        w_ptr,
        y_ptr,
        M,
        H,
        W,
        Ho,
        Wo,
        Cg,
        Og,
        Ogp,
        sxn,
        sxc,
        sxh,
        sxw,
        syn,
        syc,
        syh,
        syw,
        KH: tl.constexpr,
        KW: tl.constexpr,
        SH: tl.constexpr,
        SW: tl.constexpr,
        PH: tl.constexpr,
        PW: tl.constexpr,
        DH: tl.constexpr,
        DW: tl.constexpr,
        RM: tl.constexpr,
        RN: tl.constexpr,
        TM: tl.constexpr,
        TN: tl.constexpr,
        LF: tl.constexpr,
    ):
        # y[n, g*Og+o, oh, ow] = -sum_{c,i,j} |x[n, g*Cg+c, oh*SH-PH+i*DH, ow*SW-PW+j*DW] - w[g, i, j, c, o]|
        # w is pre-permuted to [G, KH, KW, Cg, Ogp] in fp32, Ogp = Og padded to a multiple of _PAD.
        BM: tl.constexpr = RM * TM
        BN: tl.constexpr = RN * TN
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        g = tl.program_id(2)
        offs_m, offs_n = _tile_offsets(pid_m * BM, pid_n * BN, RM, RN, TM, TN, LF)
        mc = tl.minimum(offs_m, M - 1)  # clamped: every load is in bounds, stores are masked
        ow = mc % Wo
        t = mc // Wo
        oh = t % Ho
        nb = t // Ho
        x_img = x_ptr + nb.to(tl.int64) * sxn + g * Cg * sxc
        w_grp = w_ptr + g * (KH * KW * Cg * Ogp) + offs_n  # rows padded to Ogp: no mask, constant offsets
        acc = tl.zeros_like((offs_m + offs_n).to(tl.float32))
        for i in tl.static_range(KH):
            ih = oh * SH - PH + i * DH
            ih_ok = (ih >= 0) & (ih < H)
            ihc = tl.minimum(tl.maximum(ih, 0), H - 1)
            for j in tl.static_range(KW):
                iw = ow * SW - PW + j * DW
                ok = ih_ok & (iw >= 0) & (iw < W)
                xp = x_img + ihc * sxh + tl.minimum(tl.maximum(iw, 0), W - 1) * sxw
                wp = w_grp + (i * KW + j) * Cg * Ogp
                # x for channel c+1 is loaded before channel c is used (register double buffer:
                # hides the L2 latency of the pixel loads behind 2*RM*RN FADDs)
                xv = tl.load(xp).to(tl.float32)
                for c in range(1, Cg + 1):
                    xn = tl.load(xp + tl.minimum(c, Cg - 1) * sxc).to(tl.float32)
                    if PH > 0 or PW > 0:
                        xv = tl.where(ok, xv, 0.0)
                    wv = tl.load(wp + (c - 1) * Ogp).to(tl.float32)
                    acc += tl.abs(xv - wv)
                    xv = xn
        y = (-acc).to(y_ptr.dtype.element_ty)
        yp = y_ptr + nb.to(tl.int64) * syn + (g * Og + offs_n) * syc + oh * syh + ow * syw
        tl.store(yp, y, mask=(offs_m < M) & (offs_n < Og))

    @triton.jit
    def _dgrad_kernel(
        x_ptr,
        w_ptr,
        g_ptr,
        dx_ptr,
        N,
        H,
        W,
        Ho,
        Wo,
        Cg,
        Cgp,
        Og,
        Hc,
        Wc,
        sxn,
        sxc,
        sxh,
        sxw,
        sgn,
        sgc,
        sgh,
        sgw,
        sdn,
        sdc,
        sdh,
        sdw,
        KH: tl.constexpr,
        KW: tl.constexpr,
        SH: tl.constexpr,
        SW: tl.constexpr,
        PH: tl.constexpr,
        PW: tl.constexpr,
        DH: tl.constexpr,
        DW: tl.constexpr,
        RM: tl.constexpr,
        RN: tl.constexpr,
        TM: tl.constexpr,
        TN: tl.constexpr,
        LF: tl.constexpr,
    ):
        # dx[n, g*Cg+c, h, w] = sum_{o,i,j: h = oh*SH-PH+i*DH, w = ow*SW-PW+j*DW} gout * clamp(w - x, -1, 1)
        # w is pre-transformed to w/2 + 1/2 and permuted to [G, KH, KW, Og, Cgp] (fp32, Cg padded).
        # Grid axis 2 = group x stride residue class (ph, pw); axis 0 tiles the N*Hc*Wc pixels
        # h = ph + SH*hq, w = pw + SW*wq of that class; axis 1 tiles the Cg channels.
        BM: tl.constexpr = RM * TM
        BN: tl.constexpr = RN * TN
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        pz = tl.program_id(2)
        g = pz // (SH * SW)
        ph = (pz % (SH * SW)) // SW
        pw = pz % SW
        Mc = N * Hc * Wc
        offs_m, offs_n = _tile_offsets(pid_m * BM, pid_n * BN, RM, RN, TM, TN, LF)
        mc = tl.minimum(offs_m, Mc - 1)
        nc = tl.minimum(offs_n, Cg - 1)
        wq = mc % Wc
        t = mc // Wc
        hq = t % Hc
        nb = t // Hc
        h = ph + hq * SH
        w = pw + wq * SW
        m_ok = (offs_m < Mc) & (h < H) & (w < W)
        hs = tl.minimum(h, H - 1)
        ws = tl.minimum(w, W - 1)
        xh = 0.5 * tl.load(x_ptr + nb.to(tl.int64) * sxn + (g * Cg + nc) * sxc + hs * sxh + ws * sxw).to(tl.float32)
        g_img = g_ptr + nb.to(tl.int64) * sgn + g * Og * sgc
        w_grp = w_ptr + g * (KH * KW * Og * Cgp) + offs_n
        acc = tl.zeros_like((offs_m + offs_n).to(tl.float32))
        gsum = tl.zeros_like(offs_m.to(tl.float32))
        for i in tl.static_range(KH):
            if (ph + PH - i * DH) % SH == 0:  # taps of this row hit the class (uniform per program)
                nh = h + PH - i * DH  # = oh * SH when the tap is valid
                h_ok = (nh >= 0) & (nh < Ho * SH)
                ohc = tl.minimum(tl.maximum(nh, 0) // SH, Ho - 1)
                for j in tl.static_range(KW):
                    if (pw + PW - j * DW) % SW == 0:
                        nw = w + PW - j * DW
                        ok = m_ok & h_ok & (nw >= 0) & (nw < Wo * SW)
                        gp = g_img + ohc * sgh + tl.minimum(tl.maximum(nw, 0) // SW, Wo - 1) * sgw
                        wp = w_grp + (i * KW + j) * Og * Cgp
                        gv = tl.load(gp).to(tl.float32)  # double buffer, as in the forward
                        for o in range(1, Og + 1):
                            gn = tl.load(gp + tl.minimum(o, Og - 1) * sgc).to(tl.float32)
                            gv = tl.where(ok, gv, 0.0)
                            wv = tl.load(wp + (o - 1) * Cgp)
                            u = tl.minimum(tl.maximum(wv - xh, 0.0), 1.0)  # (clamp(w - x, -1, 1) + 1) / 2
                            acc += gv * u
                            gsum += gv
                            gv = gn
        dx = (2.0 * acc - gsum).to(dx_ptr.dtype.element_ty)
        dp = dx_ptr + nb.to(tl.int64) * sdn + (g * Cg + offs_n) * sdc + h * sdh + w * sdw
        tl.store(dp, dx, mask=m_ok & (offs_n < Cg))


def _triton_version():
    return tuple(int(p) for p in re.findall(r"\d+", triton.__version__)[:2])


# Lane dims first before Triton 3.7 (checked on 3.6; see the module docstring), for TN == 1 tiles only:
# on that version the 2-D tiles compile better in the other order (the forward without spills).
LANES_FIRST = triton is not None and _triton_version() < (3, 7)


def _tile(rm, rn, tm, tn):
    return dict(RM=rm, RN=rn, TM=tm, TN=tn, LF=LANES_FIRST and tn == 1)


def _cfg(rm, rn, tm, tn, num_warps):
    return triton.Config(_tile(rm, rn, tm, tn), num_warps=num_warps, num_stages=1)


# Tile configs (RM, RN, TM, TN, warps), TM * TN == 32 * warps. Family "TN=1": lanes along pixels,
# each thread RM pixels x RN channels, the RN weights are warp-uniform vector loads (RN = 16 suits
# ResNet-20's 16 channels, RN = 32 wider layers, RM = 2 layers with few pixels). Family "2-D":
# BM and BN below the thread count, 4x8 per thread. scripts/triton_sass_report.py prints the
# registers and hot-loop instruction mix of each on sm_90 without a GPU: FP share of the loop
# 88 % (4,32), 84 % (4,16), 77 % (2,16), 59-69 % (2-D) in the forward; wider input-gradient
# tiles (4,32 or 8,16) spill, so that kernel stops at 4,16.
_FWD_CONFIGS = [(4, 32, 128, 1, 4), (4, 16, 128, 1, 4), (2, 16, 128, 1, 4), (4, 8, 16, 8, 4)]
_DGRAD_CONFIGS = [(4, 16, 128, 1, 4), (2, 16, 128, 1, 4), (4, 8, 16, 8, 4)]
_INTERPRET_CONFIG = (2, 2, 8, 4, 1)  # small tile, TN > 1 and RM, RN > 1: exercises the 4-D mapping


def _prune(configs, named_args, **kwargs):
    """Drop tiles much wider than the channel count (they would mostly compute padding)."""
    args = {**named_args, **kwargs}
    width = args["Cg"] if "Hc" in args else args["Og"]  # dgrad tiles input channels, fwd output channels
    keep = [c for c in configs if c.kwargs["RN"] * c.kwargs["TN"] <= max(16, triton.next_power_of_2(width))]
    return keep or configs[:1]


def _autotuned(kernel, configs):
    kw = {}
    if "do_bench" in inspect.signature(triton.autotune).parameters:  # short benches: bounded tuning time
        kw["do_bench"] = lambda fn, quantiles=None, **_: triton.testing.do_bench(
            fn, warmup=5, rep=20, quantiles=quantiles
        )
    return triton.autotune(
        [_cfg(*c) for c in configs],
        prune_configs_by={"early_config_prune": _prune},
        key=["Cg", "Og", "Ho", "Wo", "KH", "KW", "SH", "SW", "PH", "PW", "DH", "DW"],
        **kw,
    )(kernel)


if triton is not None and not INTERPRET:
    _fwd = _autotuned(_fwd_kernel, _FWD_CONFIGS)
    _dgrad = _autotuned(_dgrad_kernel, _DGRAD_CONFIGS)
else:
    _fwd = _dgrad = None


def _launch(kernel, tuned, grid_fn, args, meta, config):
    """Run on x's (args[0]'s) device with `config` = (RM, RN, TM, TN, warps) if given, else autotuned (a fixed
    small tile under the interpreter, where autotuning would only cost time)."""
    with torch.cuda.device(args[0].device) if args[0].is_cuda else _nullcontext():
        if config is None and tuned is not None:
            tuned[grid_fn](*args, **meta)
            return
        rm, rn, tm, tn, nw = config or _INTERPRET_CONFIG
        if tm * tn != 32 * nw or _PAD % (rn * tn):
            raise ValueError(f"bad tile config {config}: need TM*TN == 32*warps and RN*TN dividing {_PAD}")
        tile = _tile(rm, rn, tm, tn)
        kernel[grid_fn(tile)](*args, **meta, **tile, num_warps=nw, num_stages=1)


_PAD = 128  # multiple of every tile width in _CONFIGS


def _pad_last(t):
    """Contiguous copy of t with the last dim zero-padded to a multiple of _PAD (tiles read it unmasked)."""
    n = t.shape[-1]
    out = t.new_zeros(*t.shape[:-1], triton.cdiv(n, _PAD) * _PAD)
    out[..., :n] = t
    return out


_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class _Geometry(NamedTuple):
    N: int
    H: int
    W: int
    Cg: int  # input channels per group
    Og: int  # output channels per group
    KH: int
    KW: int
    Ho: int
    Wo: int
    SH: int
    SW: int
    PH: int
    PW: int
    DH: int
    DW: int

    @property
    def meta(self):
        """The kernels' compile-time constants."""
        return {k: getattr(self, k) for k in ("KH", "KW", "SH", "SW", "PH", "PW", "DH", "DW")}


def _geometry(x, w, stride, padding, dilation, groups):
    """The checked inputs' sizes and the convolution's constants, as both kernels take them."""
    check_inputs(x, w, stride, padding, dilation, groups, dtypes=_DTYPES)
    _check_span(x, "x")
    (N, _, H, W), (O, Cg, KH, KW) = x.shape, w.shape
    Ho, Wo = out_hw(x.shape, w.shape, stride, padding, dilation)
    return _Geometry(N, H, W, Cg, O // groups, KH, KW, Ho, Wo, *stride, *padding, *dilation)


def _check_span(t, name):
    """Offsets inside one image are int32 (the image base is int64)."""
    span = sum((s - 1) * abs(st) for s, st in zip(t.shape[1:], t.stride()[1:])) + 1
    if span >= 2**31:
        raise ValueError(
            f"one image of {name} spans {span} elements; the kernels index within an image "
            "with int32: use fewer channels or a smaller image per call"
        )


def _check_grid(z):
    if z > 65535:  # CUDA's limit on grid axis 2
        raise ValueError(f"groups x stride classes = {z} exceeds 65535 programs on grid axis 2; reduce groups")


def forward(x, w, stride, padding, dilation, groups, config=None):
    """y = -sum |x - w| (no bias), fp32 accumulation, returned in x's dtype and memory format.

    config: optional tile (RM, RN, TM, TN, warps) overriding the autotuner (tests, benchmarks)."""
    g = _geometry(x, w, stride, padding, dilation, groups)
    N, H, W, Cg, Og, KH, KW, Ho, Wo = g[:9]
    O = w.shape[0]
    y = torch.empty((N, O, Ho, Wo), device=x.device, dtype=x.dtype, memory_format=output_format(x))
    M = N * Ho * Wo
    if M == 0 or O == 0:
        return y
    if M >= 2**31 - 2**12:
        raise ValueError(f"N*Ho*Wo = {M} output pixels exceed int32; split the batch")
    _check_span(y, "y")
    _check_grid(groups)
    if Cg == 0:
        return y.zero_()
    # [G, KH, KW, Cg, Ogp] in fp32 (exact, and small): fp16/bf16 inputs convert only x in the loop
    wt = _pad_last(w.float().reshape(groups, Og, Cg, KH, KW).permute(0, 3, 4, 2, 1))
    grid = lambda m: (triton.cdiv(M, m["RM"] * m["TM"]), triton.cdiv(Og, m["RN"] * m["TN"]), groups)
    args = (x, wt, y, M, H, W, Ho, Wo, Cg, Og, wt.shape[-1], *x.stride(), *y.stride())
    _launch(_fwd_kernel, _fwd, grid, args, g.meta, config)
    return y


def grad_input(x, w, grad_out, stride, padding, dilation, groups, config=None):
    """dL/dx = sum over the outputs each input touches of g * HardTanh(w - x) (Eq. 7); config as in forward."""
    g = _geometry(x, w, stride, padding, dilation, groups)
    check_grad_out(grad_out, x, w, stride, padding, dilation)
    N, H, W, Cg, Og, KH, KW, Ho, Wo, SH, SW = g[:11]
    O = w.shape[0]
    dx = torch.empty_like(x, memory_format=output_format(x))
    if dx.numel() == 0:
        return dx
    if O == 0 or Ho * Wo == 0:
        return dx.zero_()
    Hc, Wc = triton.cdiv(H, SH), triton.cdiv(W, SW)
    if N * Hc * Wc >= 2**31 - 2**12:
        raise ValueError(f"{N * Hc * Wc} input pixels per stride class exceed int32; split the batch")
    _check_span(grad_out, "grad_out")
    _check_grid(groups * SH * SW)
    grad_out = grad_out.to(x.dtype)
    wp = _pad_last((0.5 * w.float() + 0.5).reshape(groups, Og, Cg, KH, KW).permute(0, 3, 4, 1, 2))  # [G,KH,KW,Og,Cgp]
    grid = lambda m: (triton.cdiv(N * Hc * Wc, m["RM"] * m["TM"]), triton.cdiv(Cg, m["RN"] * m["TN"]), groups * SH * SW)
    args = (
        x,
        wp,
        grad_out,
        dx,
        N,
        H,
        W,
        Ho,
        Wo,
        Cg,
        wp.shape[-1],
        Og,
        Hc,
        Wc,
        *x.stride(),
        *grad_out.stride(),
        *dx.stride(),
    )
    _launch(_dgrad_kernel, _dgrad, grid, args, g.meta, config)
    return dx
