"""The AdderQuant quantiser (docs/quantization.md), as pure tensor functions.

One scale s per group of filters, shared by the weights and the activations of that group:
    s_g = min(A, max |W_g|)                   (A: the layer's calibrated activation range)
    q_w = clip(round(w (2^b-1) / (2 s)), -2^(b-1), 2^(b-1)-1)      w_hat = q_w 2s / (2^b-1)
    q_a = clip(round(x (2^b-1) / s), 0, 2^b-1)                       x_hat = q_a s / (2^b-1)
    Y   = -sum |x_hat - w_hat| + beta = -(s / (2^b-1)) sum |q_a - 2 q_w| + beta
Weights beyond A are first clamped to [-A, A] with the bias term beta = -sum max(|w| - A, 0) (section
3b), exact for |x| <= A because |x - w| = |x - sign(w) A| + (|w| - A). Rounding is torch.round (half to
even) everywhere; the same expressions serve the float (fake-quantised) and the integer paths.
"""

import torch


def levels(bits):
    """2^b - 1: the number of activation steps over [0, s]."""
    return 2 ** int(bits) - 1


def lane(bits):
    """The integer kernel's unsigned lane type for b-bit operands: uint8 up to 8 bits, uint16 above."""
    return torch.uint8 if int(bits) <= 8 else torch.uint16


def unsigned_form(q_w):
    """(u, c) of signed weights q_w (O, ...): u = max(2 q_w, 0) elementwise and c = sum max(-2 q_w, 0) per
    filter, so that sum |q_a - 2 q_w| = sum |q_a - u| + c for q_a >= 0 (the integer kernel's operands are
    then both unsigned). In q_w's dtype; callers cast."""
    return (2 * q_w).clamp(min=0), (-2 * q_w).clamp(min=0).flatten(1).sum(1)


def clamp_weight(weight, act_range):
    """(w clamped to [-A, A], beta per filter = -sum max(|w| - A, 0)): the lossless clamp of section 3b."""
    excess = (weight.abs() - act_range).clamp(min=0)
    return weight.clamp(-act_range, act_range), -excess.flatten(1).sum(1)


def group_scales(weight, group, n_groups, act_range):
    """s_g = min(A, max |W_g|) for every group g (floored at 1e-8 so an all-zero group stays finite)."""
    peak = weight.abs().flatten(1).amax(1)
    max_abs = torch.zeros(n_groups, dtype=weight.dtype, device=weight.device).scatter_reduce(
        0, group, peak, reduce="amax", include_self=False
    )
    return max_abs.clamp(max=float(act_range)).clamp(min=1e-8)


def quantize_weight(weight, scale, bits):
    """Signed integer weights on the grid 2s/(2^b-1); `scale` is per filter (O,)."""
    inv = (levels(bits) / (2 * scale)).view(-1, *([1] * (weight.dim() - 1)))
    half = 2 ** (int(bits) - 1)
    return (weight * inv).round().clamp(-half, half - 1)


def quantize_activation(x, scale, bits):
    """Unsigned integer activations on the grid s/(2^b-1) (inputs after a ReLU), as float values."""
    return (x * (levels(bits) / scale)).round().clamp(0, levels(bits))
