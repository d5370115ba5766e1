"""Reference adder convolution: the paper's unfold formulation, short and obviously right.

It materialises an N x G x Cout/G x Cin/G*kh*kw x L tensor, so it is slow and memory-hungry;
it exists as the ground truth for tests and benchmarks, not as the default path.
"""

import torch
import torch.nn.functional as F

from .conv_args import out_hw


def _cols(x, weight, stride, padding, dilation, groups):
    """Unfold x into (N, G, K, L) columns, K = Cin/G*kh*kw; zero padding counts as input 0."""
    n = x.shape[0]
    cols = F.unfold(x, weight.shape[-2:], dilation=dilation, padding=padding, stride=stride)
    return cols.view(n, groups, cols.shape[1] // groups, cols.shape[-1])


class ReferenceAdder2dFunction(torch.autograd.Function):
    """Y = -sum|X - W|; dY/dW = X - W (Eq. 5); dY/dX = HardTanh(W - X) (Eq. 7)."""

    @staticmethod
    def forward(ctx, x, weight, stride, padding, dilation, groups):
        cols = _cols(x, weight, stride, padding, dilation, groups)  # N,G,K,L
        w = weight.reshape(groups, weight.shape[0] // groups, -1)  # G,Og,K
        diff = cols.unsqueeze(2) - w.unsqueeze(0).unsqueeze(-1)  # N,G,Og,K,L  (X - W)
        y = -diff.abs().sum(3)  # N,G,Og,L
        ctx.save_for_backward(x, weight)
        ctx.conf = (stride, padding, dilation, groups)
        return y.reshape(x.shape[0], weight.shape[0], *out_hw(x.shape, weight.shape, stride, padding, dilation))

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        stride, padding, dilation, groups = ctx.conf
        cols = _cols(x, weight, stride, padding, dilation, groups)
        w = weight.reshape(groups, weight.shape[0] // groups, -1)
        diff = cols.unsqueeze(2) - w.unsqueeze(0).unsqueeze(-1)  # X - W
        g = grad_out.reshape(x.shape[0], groups, weight.shape[0] // groups, 1, cols.shape[-1])  # N,G,Og,1,L
        grad_w = (g * diff).sum((0, 4)).reshape_as(weight)
        grad_cols = (g * (-diff).clamp(-1, 1)).sum(2)  # N,G,K,L
        grad_cols = grad_cols.reshape(x.shape[0], groups * w.shape[-1], grad_cols.shape[-1])
        grad_x = F.fold(grad_cols, x.shape[-2:], weight.shape[-2:], dilation=dilation, padding=padding, stride=stride)
        return grad_x, grad_w, None, None, None, None


def adder2d_reference(x, weight, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
    """Reference adder convolution without bias; arguments as 2-tuples."""
    return ReferenceAdder2dFunction.apply(x, weight, tuple(stride), tuple(padding), tuple(dilation), groups)
