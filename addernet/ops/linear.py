"""AdderLinear: a fully connected layer with the negative L1 distance instead of the dot product.

    y[..., j] = -sum_i |x[..., i] - W[j, i]| (+ b[j])          x: (..., in_features), W: (out, in)

A linear layer is a 1x1 convolution over the flattened leading dimensions, so it runs on the adder
convolution's kernels and backends (adder2d.py) with their gradients: dL/dW = sum g * (x - W) in full
precision (paper Eq. 5) and dL/dx = sum g * HardTanh(W - x) (Eq. 7). The M = prod(leading dims) input rows
are laid out as a few images of M / P pixels each (a strided view), and nothing of size M x out x in is
ever materialised.
"""

import torch
import torch.nn.functional as F

from .adder2d import AdderParameters, adder2d


def adder_linear(input, weight, bias=None):
    """Functional AdderLinear: input (..., in), weight (out, in), bias (out,) or None -> (..., out)."""
    if not isinstance(input, torch.Tensor) or input.dim() < 1:
        raise ValueError(
            f"adder_linear expects an input of shape (..., in_features), got "
            f"{tuple(input.shape) if isinstance(input, torch.Tensor) else type(input).__name__}"
        )
    if weight.dim() != 2:
        raise ValueError(f"adder_linear expects a 2-D weight (out_features, in_features), got {tuple(weight.shape)}")
    out_f, in_f = weight.shape
    if input.shape[-1] != in_f:
        raise ValueError(
            f"adder_linear: input has {input.shape[-1]} features in its last dimension (shape "
            f"{tuple(input.shape)}) but the weight expects in_features={in_f}"
        )
    lead, x = input.shape[:-1], input.reshape(-1, in_f)
    m = x.shape[0]
    if m == 0:  # an empty batch, as nn.Linear: an empty output, zero gradients
        y = input.sum(-1, keepdim=True) * 0 + weight.sum(1) * 0
        return y if bias is None else y + bias
    # P images of L pixels (P = CPU threads, so the kernels' per-image split keeps every thread busy): fewer,
    # larger images run faster than M images of one pixel; the zero rows padded to P*L get no gradient
    p = max(1, min(torch.get_num_threads(), m))
    length = -(-m // p)
    if p * length != m:
        x = F.pad(x, (0, 0, 0, p * length - m))
    y = adder2d(x.view(p, length, in_f).transpose(1, 2).unsqueeze(-1), weight.view(out_f, in_f, 1, 1), bias)
    return y.squeeze(-1).transpose(1, 2).reshape(p * length, out_f)[:m].view(*lead, out_f)


class AdderLinear(AdderParameters):
    """Drop-in for nn.Linear computing y = -sum_i |x_i - W_ji| (+ b_j), with the paper's gradients.

    The weight has nn.Linear's shape (out_features, in_features) and, like Adder2d's, starts N(0, 1);
    the bias (off by default, as every adder layer feeds a normalisation layer) starts at zero.
    The adaptive learning rate (AdaptiveLR) treats this weight as it treats Adder2d's.
    """

    def __init__(self, in_features, out_features, bias=False, device=None, dtype=None):
        super().__init__()
        for name, v in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"AdderLinear {name} must be a positive int, got {v!r}")
        self.in_features, self.out_features = in_features, out_features
        self.make_parameters((out_features, in_features), bias, device, dtype)

    def forward(self, x):
        return adder_linear(x, self.weight, self.bias)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
