"""The AdderQuant quantiser (docs/quantization.md), as pure tensor functions.

One scale s per group of filters, shared by the weights and the activations of that group:
    s_g = min(A, max |W_g|)                   (A: the layer's calibrated activation range)
    q_a = clip(round(x (2^b-1) / s), 0, 2^b-1)                       x_hat = q_a s / (2^b-1)
Weights, by the grid (quant.weight_grid):
  signed (AdderQuant): weights clamped to [-A, A], b-bit signed on a grid of two activation steps,
    q_w = clip(round(w (2^b-1) / (2 s)), -2^(b-1), 2^(b-1)-1)      w_hat = q_w 2s / (2^b-1)
    Y   = -sum |x_hat - w_hat| + beta = -(s / (2^b-1)) sum |q_a - 2 q_w| + beta
  unsigned (ours): weights clamped to [0, A], b-bit unsigned on the activation grid itself,
    q_w = clip(round(w (2^b-1) / s), 0, 2^b-1)                       w_hat = q_w s / (2^b-1)
    Y   = -(s / (2^b-1)) sum |q_a - q_w| + beta
The clamp is exact with its bias term beta = -sum dist(w, [low, A]) (section 3b): for x in [0, A],
|x - w| = |x - A| + (w - A) when w > A, and |x - w| = |x - 0| + |w| when w < 0 <= x. The inputs of
every adder layer follow a ReLU, so the signed grid spends half of its levels on weights below 0,
which the unsigned grid replaces by 0 exactly: twice the weight resolution at the same bit width.
Rounding is torch.round (half to even) everywhere; the same expressions serve the float
(fake-quantised) and the integer paths, which read weights in activation steps (grid_step).
"""

import torch

GRIDS = ("unsigned", "signed")


def grid_step(grid):
    """The weight grid in activation steps: 1 for the unsigned grid, 2 for AdderQuant's signed grid."""
    return {"unsigned": 1, "signed": 2}[grid]


def levels(bits):
    """2^b - 1: the number of activation steps over [0, s]."""
    return 2 ** int(bits) - 1


def lane(bits):
    """The integer kernel's unsigned lane type for b-bit operands: uint8 up to 8 bits, uint16 above."""
    return torch.uint8 if int(bits) <= 8 else torch.uint16


def unsigned_form(v):
    """(u, c) of integer weights v (O, ...) in activation steps (step * q_w): u = max(v, 0) elementwise and
    c = sum max(-v, 0) per filter, so that sum |q_a - v| = sum |q_a - u| + c for q_a >= 0 (the integer
    kernel's operands are then both unsigned). In v's dtype; callers cast."""
    return v.clamp(min=0), (-v).clamp(min=0).flatten(1).sum(1)


def clamp_weight(weight, act_range, grid="signed"):
    """(w clamped to [low, A], beta per filter = -sum of |w|'s distance to [low, A]): the lossless clamp of
    section 3b, low = -A (signed grid) or 0 (unsigned grid; exact for inputs >= 0)."""
    low = 0.0 if grid == "unsigned" else -float(act_range)
    clamped = weight.clamp(low, act_range)
    return clamped, -(weight - clamped).abs().flatten(1).sum(1)


def group_scales(weight, group, n_groups, act_range):
    """s_g = min(A, max |W_g|) for every group g (floored at 1e-8 so an all-zero group stays finite)."""
    peak = weight.abs().flatten(1).amax(1)
    max_abs = torch.zeros(n_groups, dtype=weight.dtype, device=weight.device).scatter_reduce(
        0, group, peak, reduce="amax", include_self=False
    )
    return max_abs.clamp(max=float(act_range)).clamp(min=1e-8)


def quantize_weight(weight, scale, bits, grid="signed"):
    """Integer weights: signed on the grid 2s/(2^b-1), or unsigned on s/(2^b-1); `scale` is per filter (O,)."""
    inv = (levels(bits) / (grid_step(grid) * scale)).view(-1, *([1] * (weight.dim() - 1)))
    if grid == "unsigned":
        return (weight * inv).round().clamp(0, levels(bits))
    half = 2 ** (int(bits) - 1)
    return (weight * inv).round().clamp(-half, half - 1)


def weight_dtype(bits, grid):
    """Storage of b-bit integer weights: int8 / uint8 up to 8 bits, else int16 (signed) / int32 (unsigned)."""
    if grid == "unsigned":
        return torch.uint8 if int(bits) <= 8 else torch.int32
    return torch.int8 if int(bits) <= 8 else torch.int16


def quantize_activation(x, scale, bits):
    """Unsigned integer activations on the grid s/(2^b-1) (inputs after a ReLU), as float values."""
    return (x * (levels(bits) / scale)).round().clamp(0, levels(bits))
