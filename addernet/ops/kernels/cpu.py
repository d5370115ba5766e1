"""Fast CPU backend: the compiled C kernel (adder_cpu.c) with the batch split across threads (a batch
smaller than the thread count splits its groups, or else the forward its output pixels).

The threads are torch's own OpenMP workers (the kernel links the libgomp torch loaded, see
build.py): a separate pool would compete with those workers, which spin-wait after every torch
op, and measured no faster than one thread. Built without OpenMP, a Python thread pool runs the
ranges instead (ctypes releases the GIL). float16/bfloat16 are computed in float32 and cast back.
"""

import ctypes
import functools
import math
import os
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F

from ..conv_args import as_dtype, compute_dtype, output_format
from .build import Geometry, library

_KERNEL_DTYPES = {torch.float32: "_f", torch.float64: "_d"}
_pool = (None, 0, 0)  # (executor, workers, pid)
SERIAL_WORK = 1 << 20
# the largest weight whose gradient the input-gradient kernel sums as it goes (grad_input_weight): at batch 8, 1 thread,
# a 3x3 layer of 128 channels (0.6 MB) took 0.98x the separate passes' time, 256 (2.4 MB) 1.01x, 512 (9.4 MB) 1.10x
FUSED_WEIGHT_BYTES = 1 << 20

_P, _I64, _GEOM = ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(Geometry)
# adder_cpu.c's functions per dtype suffix: name -> (result type, argument types)
FUNCTIONS = {"adder_vbytes": (ctypes.c_int, ())}
for _suf in _KERNEL_DTYPES.values():
    FUNCTIONS |= {
        "adder_forward" + _suf: (ctypes.c_int, (_P, _P, _P, _P, _P, _GEOM, *[_I64] * 6)),
        "adder_forward_min_form" + _suf: (ctypes.c_int, (_GEOM,)),
        "adder_grad_input" + _suf: (ctypes.c_int, (_P, _P, _P, _P, _P, _P, _P, _GEOM, _P, *[_I64] * 5)),
        "adder_forward_ranges" + _suf: (ctypes.c_int, (_P, _P, _P, _P, _P, _GEOM, _P, _I64, ctypes.c_int)),
        "adder_grad_input_ranges" + _suf: (
            ctypes.c_int,
            (_P, _P, _P, _P, _P, _P, _P, _GEOM, _P, _P, _I64, ctypes.c_int),
        ),
    }


def _lib():
    """The kernel library for the instruction set chosen now (build.cpu_isa: $ADDERNET_CPU_ISA)."""
    return library("adder_cpu", FUNCTIONS)


def path():
    """The compiled path in use: avx512, avx2, sse2 or plain C."""
    return _lib().adder_path().decode()


def available():
    """Build/load the kernel now; raises build.BuildError when it cannot be built."""
    _lib()
    return True


def _run(lib, fn, dt, args, ranges, work):
    """Run kernel `fn` of `lib` (the caller's _lib(), so that one call reads the environment once) for dtype `dt` over
    `ranges` in parallel, raising on failure; on one thread when there is one range or too little work (`work` ~
    abs-differences)."""
    global _pool
    suf = _KERNEL_DTYPES[dt]
    workers = 1 if len(ranges) == 1 or work < SERIAL_WORK else torch.get_num_threads()
    if lib.adder_openmp():
        flat = [v for r in ranges for v in r]
        status = [getattr(lib, fn + "_ranges" + suf)(*args, _arr(flat), len(ranges), workers)]
    elif workers == 1:
        status = [getattr(lib, fn + suf)(*args, *r) for r in ranges]
    else:
        jobs = [functools.partial(getattr(lib, fn + suf), *args, *r) for r in ranges]
        pool, n, pid = _pool
        if pool is None or n != workers or pid != os.getpid():  # a forked child needs its own threads
            pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="adder")
            _pool = (pool, workers, os.getpid())
        status = [f.result() for f in [pool.submit(job) for job in jobs]]
    if any(status):
        raise MemoryError("adder CPU kernel could not allocate its per-image scratch buffer")


def _arr(values):
    return (ctypes.c_int64 * len(values))(*values)


@functools.lru_cache(maxsize=1024)
def _geometry(x_shape, w_shape, stride, padding, dilation, groups, vl, cpad):
    """The Geometry of input shape ``x_shape`` against weight shape ``w_shape`` (stride, padding, dilation: int
    2-tuples), ``vl`` elements to a vector; output channels per group padded to the vector width, and with ``cpad``
    the input channels per group too (the input gradient's scratch). Kept per shape, as a training step repeats its
    layers' shapes, and shared: the kernels only read it (const adder_geometry *), and a caller that changes a field
    changes a copy (_scores_geometry)."""
    cg, og = w_shape[1], w_shape[0] // groups
    cgp = -(-cg // vl) * vl if cpad else cg
    return Geometry.of(x_shape, w_shape, stride, padding, dilation, groups, Cgp=cgp, Opad=-(-og // vl) * vl)


def _vl(lib, dt):
    """Elements of dtype ``dt`` to one of the kernel's vectors."""
    return lib.adder_vbytes() // dt.itemsize


def _splits(total, parts):
    step = -(-total // parts)
    return [(a, min(a + step, total)) for a in range(0, total, step)]


def _image_ranges(n, groups, workers):
    """(n0, n1, g0, g1) per thread: the images split, or, for fewer images than threads, each image's groups."""
    if n >= workers or groups == 1:
        return [(a, b, 0, groups) for a, b in _splits(n, workers)]
    return [(i, i + 1, a, b) for i in range(n) for a, b in _splits(groups, workers)]


def _pointwise_view(x, w, stride, padding):
    """The pixels a strided 1x1 layer without padding reads, as a view of x, or None for any other layer. The kernels
    copy an NCHW image into a channels-last scratch before they reduce over its channels (the input gradient always,
    the forward when the image is large); a 1x1 layer at stride s reads only every s-th pixel, so running it at stride
    1 on this view copies Ho*Wo pixels instead of H*W (a quarter at stride 2) and sums the same terms in the same
    order. A channels-last input is read in place already."""
    if w.shape[2:] != (1, 1) or tuple(padding) != (0, 0) or tuple(stride) == (1, 1):
        return None
    if output_format(x) == torch.channels_last:
        return None
    return x[:, :, :: stride[0], :: stride[1]]


def _negated_forward_weight(lib, s, dt):
    """Whether the forward of the layer with geometry s takes the weight negated: the direct form computes x - w as
    x + (-w); the min form (adder_forward_min_form: AVX2 and AVX-512, more than one tap) sums min(x, w)."""
    return not getattr(lib, "adder_forward_min_form" + _KERNEL_DTYPES[dt])(s)


def _pack_forward(w, opad, vl, negate, group_dims=1):
    """w (*G, *k, Og), G the first group_dims dimensions: each group's weight as an array k of Og output channels
    (k: the taps and input channels in the order the kernel steps through them) -> the weight packed per group in
    blocks of 2*vl output channels, [k][block] each, zero in Og..Opad-1 (adder_cpu.c), (prod G, K*Opad); negated with
    `negate` (_negated_forward_weight). One pass over w when Og is a multiple of vl
    (a 512->512 3x3 weight: 2.4 ms, against 30 ms in five passes, on a Sapphire Rapids-class Xeon, 1 thread). Each
    part is moved only where there is one: a layer of up to vl output channels per group has no full block, and the
    empty block's views and move cost more than the rest of a small layer's packing."""
    w = w.detach()
    if w.shape[-1] < opad:
        w = F.pad(w, (0, opad - w.shape[-1]))
    groups, taps, full = w.shape[:group_dims], w.shape[group_dims:-1], opad // (2 * vl) * (2 * vl)
    k = math.prod(taps)
    out = torch.empty(math.prod(groups), k * opad, dtype=w.dtype)
    move = torch.neg if negate else lambda src, out: out.copy_(src)
    if full:  # (*G, blocks, *k, 2vl)
        blocks = w[..., :full].unflatten(-1, (full // (2 * vl), 2 * vl)).movedim(-2, group_dims)
        move(blocks, out=out[:, : k * full].view(*groups, full // (2 * vl), *taps, 2 * vl))
    if full < opad:
        move(w[..., full:], out=out[:, k * full :].view(*groups, *taps, opad - full))
    return out


def _pack_grad_input(w, cgp, vl):
    """w (..., Og, kh, kw, Cg): each group's weight -> [G][kh][kw][Cgp/vl][Og][vl] (zero channel padding): a kernel
    tile streams one contiguous block of it."""
    og, kh, kw, cg = w.shape[-4:]
    w = w.detach() if cg == cgp else F.pad(w.detach(), (0, cgp - cg))
    return w.reshape(-1, og, kh, kw, cgp // vl, vl).permute(0, 2, 3, 4, 1, 5).contiguous()


def _forward_ranges(s):
    """(n0, n1, q0, q1, g0, g1) per thread: images, else groups, else (small batch, few groups) each image's pixels."""
    workers, pixels = torch.get_num_threads(), s.Ho * s.Wo
    if s.N >= workers or s.G >= workers:
        return [(n0, n1, 0, pixels, g0, g1) for n0, n1, g0, g1 in _image_ranges(s.N, s.G, workers)]
    return [(n, n + 1, a, b, 0, s.G) for n in range(s.N) for a, b in _splits(pixels, workers)]


def forward(x, w, stride, padding, dilation, groups):
    """y = -sum|x - w| (no bias), shape (N, Cout, Ho, Wo), in x's memory format (conv_args.output_format)."""
    view = _pointwise_view(x, w, stride, padding)
    if view is not None:
        return forward(view, w, (1, 1), (0, 0), dilation, groups)
    lib, dt = _lib(), compute_dtype(x.dtype)
    xk, wk = as_dtype(x, dt), as_dtype(w, dt)
    vl = _vl(lib, dt)
    s = _geometry(x.shape, w.shape, stride, padding, dilation, groups, vl, False)
    per_group = wk.reshape(groups, s.Og, s.Cg, s.kh, s.kw)
    wt = _pack_forward(per_group.permute(0, 3, 4, 2, 1), s.Opad, vl, _negated_forward_weight(lib, s, dt))
    y = torch.empty(s.N, w.shape[0], s.Ho, s.Wo, dtype=dt, memory_format=output_format(x))
    if y.numel() == 0:
        return as_dtype(y, x.dtype)
    args = (xk.data_ptr(), _arr(xk.stride()), wt.data_ptr(), y.data_ptr(), _arr(y.stride()), s)
    _run(lib, "adder_forward", dt, args, _forward_ranges(s), y.numel() * s.Cg * s.kh * s.kw)
    return as_dtype(y, x.dtype)


def grad_input(x, w, grad_out, stride, padding, dilation, groups):
    """grad_x = sum over the outputs each input touches of g * HardTanh(w - x), in x's memory format."""
    return _grad_input(x, w, grad_out, stride, padding, dilation, groups, False)[0]


def grad_input_weight(x, w, grad_out, stride, padding, dilation, groups):
    """(grad_input(...), sum_{n,pixels} g * X as a weight-shaped tensor): the weight gradient's product term, from the
    operands the input gradient's tiles hold anyway (one FMA per term), instead of a convolution weight-gradient pass
    over X and g. The weight gradient is this minus W * sum g (adder2d.grad_weight). None in place of the product term
    for a weight of more than FUSED_WEIGHT_BYTES: each tile of 8 pixels adds into the whole weight-shaped sum, which
    then no longer stays in cache."""
    fused = w.numel() * compute_dtype(x.dtype).itemsize <= FUSED_WEIGHT_BYTES
    return _grad_input(x, w, grad_out, stride, padding, dilation, groups, fused)


def _grad_input(x, w, grad_out, stride, padding, dilation, groups, wgrad):
    view = _pointwise_view(x, w, stride, padding)
    if view is not None:  # the pixels the layer skips get no gradient, and add nothing to the weight's
        gx = torch.zeros(x.shape, dtype=x.dtype, device=x.device)  # NCHW: _pointwise_view takes no other
        gv, gw = _grad_input(view, w, grad_out, (1, 1), (0, 0), dilation, groups, wgrad)
        gx[:, :, :: stride[0], :: stride[1]] = gv
        return gx, gw
    lib, dt = _lib(), compute_dtype(x.dtype)
    xk, wk, gk = as_dtype(x, dt), as_dtype(w, dt), as_dtype(grad_out, dt)
    vl = _vl(lib, dt)
    s = _geometry(x.shape, w.shape, stride, padding, dilation, groups, vl, True)
    per_group = wk.reshape(groups, s.Og, s.Cg, s.kh, s.kw).permute(0, 1, 3, 4, 2)
    w2 = _pack_grad_input(per_group, s.Cgp, vl)
    gx = torch.empty(x.shape, dtype=dt, memory_format=output_format(x))
    work = gx.numel() and gk.numel()
    ranges = [(*r, slot) for slot, r in enumerate(_image_ranges(s.N, s.G, torch.get_num_threads()))] if work else []
    dw = torch.zeros(max(len(ranges), 1), *w2.shape, dtype=dt) if wgrad else None  # a slot per range
    if work:
        args = (
            xk.data_ptr(),
            _arr(xk.stride()),
            w2.data_ptr(),
            gk.data_ptr(),
            _arr(gk.stride()),
            gx.data_ptr(),
            _arr(gx.stride()),
            s,
            None if dw is None else dw.data_ptr(),
        )
        _run(lib, "adder_grad_input", dt, args, ranges, gk.numel() * s.Cg * s.kh * s.kw)
    else:
        gx.zero_()
    if dw is None:
        return as_dtype(gx, x.dtype), None
    # the slots' sum, [G][kh][kw][Cgp/vl][Og][vl] -> (G*Og, Cg, kh, kw)
    gw = dw.sum(0).permute(0, 4, 3, 5, 1, 2).reshape(groups * s.Og, s.Cgp, s.kh, s.kw)[:, : s.Cg]
    return as_dtype(gx, x.dtype), gw.contiguous()


# ---- l1_scores (ops/attention.py): a weight per image, the attention layouts read and written in place -------------


def _images(a):
    """(B, H, n, d) -> (B, H*d, n, 1): n pixels of H groups of d channels, channels-last. A view when a's memory is
    [B][n][H][d] (how attention splits a projection into heads), else one copy."""
    b, h, n, d = a.shape
    return a.transpose(1, 2).reshape(b, n, 1, h * d).permute(0, 3, 1, 2)


def _scores_geometry(x, heads, m, vl, cpad):
    """Geometry of images x (B, H*d, n, 1) against a weight per image of H groups of m filters of d channels; the
    output (gradient) is (B, H, n, m): its groups n*m apart. A copy of _geometry's shared one, as it changes it."""
    n, d = x.shape[2], x.shape[1] // heads
    s = Geometry.from_buffer_copy(_geometry(x.shape, (heads * m, d, 1, 1), (1, 1), (0, 0), (1, 1), heads, vl, cpad))
    s.wimg, s.ygs = 1, n * m
    return s


def scores(q, k):
    """S[b, h, i, j] = -sum_c |q[b, h, i, c] - k[b, h, j, c]| for q (B, H, Nq, d) and k (B, H, Nk, d) of one float
    dtype: every image b its own keys as the weight of H groups. Returns S contiguous (B, H, Nq, Nk), written by the
    kernel in place; q is read in place when its memory is [B][Nq][H][d]."""
    lib, dt = _lib(), compute_dtype(q.dtype)
    b, h, nq, d = q.shape
    nk = k.shape[2]
    x, kk, vl = _images(q.to(dt)), k.to(dt), _vl(lib, dt)
    s = _scores_geometry(x, h, nk, vl, cpad=False)
    wt = _pack_forward(kk.transpose(2, 3), s.Opad, vl, _negated_forward_weight(lib, s, dt), group_dims=2)
    y = torch.empty(b, h, nq, nk, dtype=dt)
    if y.numel():
        args = (x.data_ptr(), _arr(x.stride()), wt.data_ptr(), y.data_ptr(), _arr((h * nq * nk, 1, nk, 1)), s)
        _run(lib, "adder_forward", dt, args, _forward_ranges(s), y.numel() * d)
    return y.to(q.dtype)


def scores_grad(q, k, grad, transposed):
    """The input gradient of scores() for q: dL/dq[b, h, i] = sum_j g_ij HardTanh(k_j - q_i), with g = grad (B, H,
    Nq, Nk); transposed=True reads g as its transpose (B, H, Nk, Nq) (the keys' gradient: the call with q and k
    swapped). Returns it as a view (B, H, Nq, d) of memory [B][Nq][H][d], the layout of q's projection."""
    lib, dt = _lib(), compute_dtype(q.dtype)
    b, h, nq, d = q.shape
    nk = k.shape[2]
    x, kk, vl = _images(q.to(dt)), k.to(dt), _vl(lib, dt)
    s = _scores_geometry(x, h, nk, vl, cpad=True)
    w2 = _pack_grad_input(kk[:, :, :, None, None, :], s.Cgp, vl)
    g = grad.to(dt).contiguous()
    # as (B, H*Nk, Nq, 1): channel j, pixel i of group h; g's memory is [B][H][Nq][Nk], or [B][H][Nk][Nq] transposed
    gs = (h * nq * nk, nq, 1, 1) if transposed else (h * nq * nk, 1, nk, 1)
    gx = torch.empty(b, nq, 1, h * d, dtype=dt).permute(0, 3, 1, 2)  # (B, H*d, Nq, 1) channels-last
    if gx.numel():
        args = (
            x.data_ptr(),
            _arr(x.stride()),
            w2.data_ptr(),
            g.data_ptr(),
            _arr(gs),
            gx.data_ptr(),
            _arr(gx.stride()),
            s,
            None,
        )
        ranges = [(*r, 0) for r in _image_ranges(b, h, torch.get_num_threads())]
        _run(lib, "adder_grad_input", dt, args, ranges, g.numel() * d)
    return gx.to(q.dtype).permute(0, 2, 3, 1).reshape(b, nq, h, d).transpose(1, 2)
