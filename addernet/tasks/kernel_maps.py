"""PKKD's kernel maps of a layer's (input patch, filter) pairs, computed from the layer output without unfolding.

Adder layer, Laplacian kernel: its raw output is Y = -||x - w||_1, so exp(-||x - w||_1 / sigma) = exp(Y / sigma).
Conv layer, Gaussian kernel: ||x - w||_2^2 = ||x||^2 + ||w||^2 - 2 <x, w>, where <x, w> is the raw conv output,
||x||^2 of every patch is conv2d(x^2, ones) with the layer's stride/padding/dilation/groups and ||w||^2 is per
filter. Every map is N x C_out x H x W, like the layer output. Half-precision (autocast) values are computed
in float32; float32/float64 stay as they are.
"""

import torch
import torch.nn.functional as F


def full(t):
    """``t`` in float32 if it is float16/bfloat16, else unchanged."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def laplacian_kernel(y, sigma):
    """exp(-||x - w||_1 / sigma) of an adder layer, from its raw (pre-BN, bias-free) output ``y``."""
    return torch.exp(full(y) / sigma)


def conv_sq_distance(x, y, conv):
    """||x - w||_2^2 for every (patch, filter) pair of ``conv`` (an nn.Conv2d) from its input x and raw output y.

    Clamped at 0: the expansion can go slightly negative by rounding where a patch equals a filter.
    """
    w = full(conv.weight)
    groups, out_channels = conv.groups, w.shape[0]
    if conv.bias is not None:
        y = y - conv.bias.view(1, -1, 1, 1)
    with torch.autocast(x.device.type, enabled=False):
        x = full(x).to(w.dtype)
        ones = x.new_ones(groups, w.shape[1], *w.shape[2:])
        xx = F.conv2d(x * x, ones, None, conv.stride, conv.padding, conv.dilation, groups)  # N x groups x H x W
    xx = xx.repeat_interleave(out_channels // groups, dim=1)
    ww = w.pow(2).sum((1, 2, 3)).view(1, -1, 1, 1)
    return (xx + ww - 2 * full(y)).clamp_min(0)


def gaussian_kernel(sq_distance, two_sigma_sq):
    """exp(-||x - w||_2^2 / (2 sigma^2)) from the squared distances of conv_sq_distance."""
    return torch.exp(-sq_distance / two_sigma_sq)
