"""Eager fallback backend: the unfold formulation in bounded-size chunks, plain PyTorch.

Works on any device and needs no compiler. It is used when the fast CPU kernel cannot be built,
for CUDA tensors without Triton, or on request (ADDERNET_BACKEND=eager). The work is split over
groups, output channels, images and output rows so that the largest temporary (the broadcast
x - w block) has at most BUDGET elements, whatever the layer size.
float16/bfloat16 are computed in float32 and cast back.
"""

import torch
import torch.nn.functional as F

from ..conv_args import compute_dtype, out_hw

BUDGET = 1 << 23  # elements in the largest temporary: 32 MiB in float32


def _geometry(x, w, stride, padding, dilation):
    return (*w.shape[-2:], *out_hw(x.shape, w.shape, stride, padding, dilation))


def _chunks(x, w, stride, dilation, groups, ho, wo):
    """Yield (group, o0, o1, n0, n1, r0, r1, in_r0, in_r1) with n*oc*K*rows*Wo <= BUDGET (when a
    single output row of a single channel fits)."""
    n, og, k = x.shape[0], w.shape[0] // groups, w[0].numel()
    oc = max(1, min(og, BUDGET // (k * wo)))
    rows = max(1, min(ho, BUDGET // (oc * k * wo)))
    nb = max(1, min(n, BUDGET // (oc * k * rows * wo)))
    for g in range(groups):
        for n0 in range(0, n, nb):
            for r0 in range(0, ho, rows):
                r1 = min(r0 + rows, ho)
                in_r1 = (r1 - 1) * stride[0] + dilation[0] * (w.shape[2] - 1) + 1
                yield g, oc, n0, min(n0 + nb, n), r0, r1, r0 * stride[0], in_r1


def forward(x, w, stride, padding, dilation, groups):
    """y = -sum|x - w| (no bias), contiguous, in x's dtype."""
    dt = compute_dtype(x.dtype)
    kh, kw, ho, wo = _geometry(x, w, stride, padding, dilation)
    xp = F.pad(x.to(dt), (padding[1], padding[1], padding[0], padding[0]))
    wk = w.to(dt).reshape(groups, w.shape[0] // groups, -1)  # G, Og, K
    cg, og = x.shape[1] // groups, w.shape[0] // groups
    y = torch.empty(x.shape[0], w.shape[0], ho, wo, dtype=dt, device=x.device)
    for g, oc, n0, n1, r0, r1, i0, i1 in _chunks(x, w, stride, dilation, groups, ho, wo):
        cols = F.unfold(
            xp[n0:n1, g * cg : (g + 1) * cg, i0:i1], (kh, kw), dilation=dilation, stride=stride
        )  # n, K, rows*wo
        for o0 in range(0, og, oc):
            wc = wk[g, o0 : o0 + oc]
            d = (cols.unsqueeze(1) - wc.unsqueeze(0).unsqueeze(-1)).abs_().sum(2)
            y[n0:n1, g * og + o0 : g * og + o0 + wc.shape[0], r0:r1] = -d.view(n1 - n0, -1, r1 - r0, wo)
    return y.to(x.dtype)


def grad_input(x, w, grad_out, stride, padding, dilation, groups):
    """grad_x = sum over the outputs each input touches of g * HardTanh(w - x); contiguous."""
    dt = compute_dtype(x.dtype)
    kh, kw, ho, wo = _geometry(x, w, stride, padding, dilation)
    ph, pw = padding
    xp = F.pad(x.to(dt), (pw, pw, ph, ph))
    gp = torch.zeros_like(xp)
    wk = w.to(dt).reshape(groups, w.shape[0] // groups, -1)
    gk = grad_out.to(dt)
    cg, og = x.shape[1] // groups, w.shape[0] // groups
    for g, oc, n0, n1, r0, r1, i0, i1 in _chunks(x, w, stride, dilation, groups, ho, wo):
        cols = F.unfold(xp[n0:n1, g * cg : (g + 1) * cg, i0:i1], (kh, kw), dilation=dilation, stride=stride)  # n, K, L
        acc = torch.zeros_like(cols)
        for o0 in range(0, og, oc):
            wc = wk[g, o0 : o0 + oc]  # oc, K
            gc = gk[n0:n1, g * og + o0 : g * og + o0 + wc.shape[0], r0:r1].reshape(n1 - n0, -1, 1, (r1 - r0) * wo)
            d = (wc.unsqueeze(0).unsqueeze(-1) - cols.unsqueeze(1)).clamp_(-1, 1)  # n, oc, K, L
            acc += (d.mul_(gc)).sum(1)
        gp[n0:n1, g * cg : (g + 1) * cg, i0:i1] += F.fold(
            acc, (i1 - i0, xp.shape[3]), (kh, kw), dilation=dilation, stride=stride
        )
    return gp[:, :, ph : ph + x.shape[2], pw : pw + x.shape[3]].contiguous().to(x.dtype)
