"""Adder2d: convolution with the negative L1 distance instead of the dot product.

SKELETON (to be replaced by the fast path): the functional form currently always uses the
reference implementation. The kernel contract every backend module in `kernels/` follows:

    forward(x, w, stride, padding, dilation, groups) -> y          # -sum|x - w|, no bias
    grad_input(x, w, grad_out, stride, padding, dilation, groups) -> grad_x  # sum g*HardTanh(w - x)

with stride/padding/dilation as int 2-tuples; the weight gradient is shared by all backends
(the convolution weight-gradient identity).
"""
import math

import torch
import torch.nn as nn
from torch.nn.modules.utils import _pair

from .reference import adder2d_reference


def adder2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """Functional adder convolution; same argument forms as torch.nn.functional.conv2d."""
    y = adder2d_reference(input, weight, _pair(stride), _pair(padding), _pair(dilation), groups)
    if bias is not None:
        y = y + bias.view(1, -1, 1, 1)
    return y


class Adder2d(nn.Module):
    """Drop-in for nn.Conv2d computing Y = -sum|X - W| (+ bias).

    The weight is initialised N(0, 1), as in the official AdderNet models.
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=False, padding_mode="zeros", device=None, dtype=None):
        super().__init__()
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size, self.stride = _pair(kernel_size), _pair(stride)
        self.padding, self.dilation = _pair(padding), _pair(dilation)
        self.padding_mode = padding_mode
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels // groups, *self.kernel_size, **factory))
        self.bias = nn.Parameter(torch.empty(out_channels, **factory)) if bias else None
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.normal_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x):
        return adder2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self):
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0, 0):
            s += f", padding={self.padding}"
        if self.dilation != (1, 1):
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        return s
