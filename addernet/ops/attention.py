"""Negative L1 distances between two sets of vectors, on the adder convolution's kernels:

    S[..., i, j] = -sum_c |q[..., i, c] - k[..., j, c]|          q: (..., Nq, d), k: (..., Nk, d)

the score of adder attention. Every leading index g is one group of a grouped 1x1 adder convolution:
the input is q as one image of Nq pixels with G*d channels, the weight is k as G*Nk filters of d
channels, so the fast CPU / Triton kernels (or the eager one, ADDERNET_BACKEND) compute it without
materialising (..., Nq, Nk, d).

Gradients, with g = dL/dS:
    dL/dq[i] = sum_j g_ij * HardTanh(k_j - q_i)                       (the adder input gradient, Eq. 7)
    dL/dk[j] = sum_i g_ij * HardTanh(q_i - k_j)   key_grad="hardtanh"  (both operands are activations)
             = sum_i g_ij * (q_i - k_j)           key_grad="full"      (k treated as an adder weight, Eq. 5)
Which of the two the keys get is our choice, not the paper's (docs/any_network.md).
"""

import math

import torch

from .adder2d import _backend, _cpu_kernels, _forward_op, _grad_input_op, grad_weight
from .kernels import cpu

KEY_GRADS = ("hardtanh", "full")
_ONE, _ZERO = [1, 1], [0, 0]


def _as_input(a):
    """(G, n, d) -> (1, G*d, n, 1): n pixels of G*d channels, channels-last (one copy), so that the kernels read
    whole pixels, return channels-last scores and can split the groups across threads."""
    g, n, d = a.shape
    return a.transpose(0, 1).reshape(1, n, 1, g * d).permute(0, 3, 1, 2)


def _as_weight(a):
    """(G, n, d) -> (G*n, d, 1, 1): n filters of d channels per group (a view)."""
    g, n, d = a.shape
    return a.reshape(g * n, d, 1, 1)


def _scores(x, w, groups, n_in, n_w, backend):
    """-sum|x - w| of the grouped 1x1 layout, back as (G, n_in, n_w) (a view: for a channels-last x, of the memory
    layout [n_in][G][n_w]; returned contiguous, which softmax and the product with the values read faster)."""
    y = _forward_op(x, w, _ONE, _ZERO, _ONE, groups, backend)  # (1, G*n_w, n_in, 1), x's memory format
    return y.view(groups, n_w, n_in).transpose(1, 2)


class L1Scores(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, key_grad, backend):
        groups, nq, nk = q.shape[0], q.shape[1], k.shape[1]
        ctx.save_for_backward(q, k)
        ctx.conf = (key_grad, backend)
        return _scores(_as_input(q), _as_weight(k), groups, nq, nk, backend).contiguous()

    @staticmethod
    def backward(ctx, grad):
        q, k = ctx.saved_tensors
        key_grad, backend = ctx.conf
        groups, nq, d = q.shape
        nk = k.shape[1]
        grad = grad.to(q.dtype)
        gq = gk = None
        # the output layout of q against k, channels-last: one copy, in rows of nk
        g_qk = grad.transpose(0, 1).reshape(1, nq, 1, groups * nk).permute(0, 3, 1, 2)
        if ctx.needs_input_grad[0]:
            gx = _grad_input_op(_as_input(q), _as_weight(k), g_qk, _ONE, _ZERO, _ONE, groups, backend)
            gq = gx.view(groups, d, nq).transpose(1, 2)
        if ctx.needs_input_grad[1]:
            if key_grad == "hardtanh":  # the same kernel with the roles of q and k swapped
                g_kq = grad.reshape(1, groups * nq, nk, 1)
                gx = _grad_input_op(_as_input(k), _as_weight(q), g_kq, _ONE, _ZERO, _ONE, groups, backend)
                gk = gx.view(groups, d, nk).transpose(1, 2)
            else:
                gk = grad_weight(_as_input(q), _as_weight(k), g_qk, _ONE, _ZERO, _ONE, groups).view(groups, nk, d)
        return gq, gk, None, None


@torch.library.custom_op("addernet::l1_scores_cpu", mutates_args=(), device_types="cpu")
def _scores_cpu(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The CPU kernel's scores of q (B, H, Nq, d) against a weight per image, k (B, H, Nk, d) (kernels/cpu.py)."""
    return cpu.scores(q, k)


@_scores_cpu.register_fake
def _(q, k):
    return q.new_empty(*q.shape[:3], k.shape[2])


@torch.library.custom_op("addernet::l1_scores_grad_cpu", mutates_args=(), device_types="cpu")
def _scores_grad_cpu(q: torch.Tensor, k: torch.Tensor, grad: torch.Tensor, transposed: bool) -> torch.Tensor:
    """sum_j g_ij HardTanh(k_j - q_i) per image and head (kernels/cpu.py scores_grad)."""
    return cpu.scores_grad(q, k, grad, transposed)


@_scores_grad_cpu.register_fake
def _(q, k, grad, transposed):
    b, h, n, d = q.shape
    return q.new_empty(b, n, h, d).transpose(1, 2)


class L1ScoresCPU(torch.autograd.Function):
    """l1_scores on the CPU kernel for q (B, H, Nq, d), k (B, H, Nk, d): each image's keys are its own weight, so
    the attention layouts are read and written in place (no regrouping of the B*H heads into one image)."""

    @staticmethod
    def forward(ctx, q, k, key_grad):
        ctx.save_for_backward(q, k)
        ctx.key_grad = key_grad
        return _scores_cpu(q, k)

    @staticmethod
    def backward(ctx, grad):
        q, k = ctx.saved_tensors
        grad = grad.to(q.dtype)
        gq = gk = None
        if ctx.needs_input_grad[0]:
            gq = _scores_grad_cpu(q, k, grad, False)
        if ctx.needs_input_grad[1]:
            if ctx.key_grad == "hardtanh":  # the same kernel with the roles of q and k swapped
                gk = _scores_grad_cpu(k, q, grad, True)
            else:  # sum_i g_ij (q_i - k_j), as adder2d.grad_weight
                gk = grad.transpose(-1, -2) @ q - k * grad.sum(-2).unsqueeze(-1)
        return gq, gk, None


def l1_scores(q, k, key_grad="hardtanh"):
    """S[..., i, j] = -||q[..., i, :] - k[..., j, :]||_1 for q (..., Nq, d) and k (..., Nk, d) with the same
    leading dimensions; gradients as in the module docstring. Under autocast the scores are computed and returned
    in float32, as adder2d's outputs (they are sums of |q - k|: above float16's 65504 for a few hundred features).
    Empty inputs (a size 0 anywhere) give the empty (or, for d = 0, zero) scores of the closed form."""
    if key_grad not in KEY_GRADS:
        raise ValueError(f"l1_scores key_grad must be one of {', '.join(KEY_GRADS)}, got {key_grad!r}")
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)) or q.dim() < 2 or k.dim() < 2:
        raise ValueError("l1_scores expects tensors q (..., Nq, d) and k (..., Nk, d)")
    if q.shape[:-2] != k.shape[:-2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"l1_scores: q {tuple(q.shape)} and k {tuple(k.shape)} must share their leading "
            "dimensions and their last (feature) dimension"
        )
    if q.device.type != "meta" and torch.is_autocast_enabled(q.device.type):
        q, k = q.float(), k.float()
    if not q.is_floating_point() or q.dtype != k.dtype or q.device != k.device:
        raise TypeError(
            f"l1_scores needs q and k of one float dtype on one device, got {q.dtype} on {q.device} "
            f"and {k.dtype} on {k.device}"
        )
    lead, (nq, d), nk = q.shape[:-2], q.shape[-2:], k.shape[-2]
    if q.numel() == 0 or k.numel() == 0:  # nothing to compute; the broadcast form has no element either
        return -(q.unsqueeze(-2) - k.unsqueeze(-3)).abs().sum(-1)
    backend = _backend()
    backend = "eager" if backend == "reference" else backend
    if backend == "fast" and q.device.type == "cpu" and _cpu_kernels() is cpu:
        heads = lead[-1] if lead else 1  # the last leading dimension: the groups of one image
        b = math.prod(lead[:-1])
        s = L1ScoresCPU.apply(q.reshape(b, heads, nq, d), k.reshape(b, heads, nk, d), key_grad)
    else:
        s = L1Scores.apply(q.reshape(-1, nq, d), k.reshape(-1, nk, d), key_grad, backend)
    return s.view(*lead, nq, nk)
