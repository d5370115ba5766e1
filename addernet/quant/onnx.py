"""ONNX export of an AdderNet, float or quantised, with standard operators only (opset >= 17).

An adder layer becomes: patch extraction by a fixed one-hot depthwise convolution (Conv, groups = C:
output channel c*kh*kw + t copies input channel c at kernel tap t), then Sub against the weights,
Abs, ReduceSum over the patch (in float64) and a negation. A quantised layer (QAdder2d) quantises its input per
group (Mul by (2^b-1)/s, Round, Clip), compares with the unsigned integer weights u = max(v, 0) (v: the
weights in activation steps, QAdder2d.grid_weights),
adds the constant c, rescales and adds the bias term, then restores the filter order (Concat, Gather).
The integer sums are exact in float32 (below 2^24), so the result equals the integer kernel's up to
the last rounding. The batch dimension is dynamic. The TorchScript-based exporter is used
(torch.onnx.export(dynamo=False)): the newer exporter needs the onnxscript package.
"""

import copy
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import ConfigError
from ..ops import Adder2d
from .convert import check_supported, replace_module
from .qadder import QAdder2d
from .quantizer import levels, unsigned_form


def _one_hot(channels, kh, kw):
    eye = torch.eye(kh * kw).view(kh * kw, 1, kh, kw)
    return eye.repeat(channels, 1, 1, 1)  # (C*kh*kw, 1, kh, kw): channel c*kh*kw + t <- input c, tap t


class _Patches(nn.Module):
    """x (N, C, H, W) -> (N, groups, 1, C/groups*kh*kw, L) patches by a one-hot depthwise convolution."""

    def __init__(self, channels, kernel_size, stride, padding, dilation, groups):
        super().__init__()
        self.register_buffer("one_hot", _one_hot(channels, *kernel_size))
        self.channels, self.conf, self.groups = channels, (stride, padding, dilation), groups

    def forward(self, x):
        p = F.conv2d(x, self.one_hot, None, *self.conf, groups=self.channels)
        self.out_hw = tuple(p.shape[-2:])
        return p.flatten(2).unflatten(1, (self.groups, -1)).unsqueeze(2)


class OnnxAdder2d(nn.Module):
    """Float adder layer in standard ops: -ReduceSum(Abs(patches - w)), summed in float64 (Cast): the
    adder outputs are large sums that BatchNorm then centres, so float32 summation error would show
    at 1e-4 of the logits; in float64 the one rounding left is the final cast."""

    def __init__(self, adder):
        super().__init__()
        g = adder.groups
        self.patches = _Patches(adder.in_channels, adder.kernel_size, adder.stride, adder.padding, adder.dilation, g)
        self.register_buffer("w", adder.weight.detach().double().reshape(1, g, adder.out_channels // g, -1, 1))
        self.bias = None if adder.bias is None else adder.bias.detach().view(1, -1, 1, 1)

    def forward(self, x):
        p = self.patches(x).double()
        y = -(p - self.w).abs().sum(3).flatten(1, 2).float()  # (N, O, L)
        y = y.unflatten(2, self.patches.out_hw)
        return y if self.bias is None else y + self.bias


class OnnxQAdder2d(nn.Module):
    """Quantised adder layer in standard ops, block by block as QAdder2d computes it."""

    def __init__(self, q):
        super().__init__()
        bits, lv = int(q.bits), levels(int(q.bits))
        cg = q.in_channels // q.groups
        self.patches = _Patches(cg, q.kernel_size, q.stride, q.padding, q.dilation, 1)
        self.blocks, order = [], []
        q_w = q.grid_weights()
        for k, (g, idx, chans) in enumerate(q._blocks()):
            s = q.scale[g]
            self.blocks.append((g, chans))
            self.register_buffer(f"inv{k}", levels(bits) / s)  # the same float32 value QAdder2d multiplies by
            u, c = unsigned_form(q_w[idx])
            self.register_buffer(f"u{k}", u.float().reshape(1, 1, len(idx), -1, 1))
            self.register_buffer(f"c{k}", c.float().view(1, -1, 1))
            self.register_buffer(f"step{k}", -(s / lv))
            self.register_buffer(f"beta{k}", q.bias_term[idx].view(1, -1, 1))
            order.append(idx)
        self.register_buffer("inverse", torch.argsort(torch.cat(order)))
        self.levels = float(lv)

    def forward(self, x):
        outs = []
        for k, (g, chans) in enumerate(self.blocks):
            a = torch.clamp(torch.round(x[:, chans] * getattr(self, f"inv{k}")), 0.0, self.levels)
            total = (self.patches(a) - getattr(self, f"u{k}")).abs().sum(3).flatten(1, 2) + getattr(self, f"c{k}")
            outs.append(total * getattr(self, f"step{k}") + getattr(self, f"beta{k}"))
        y = torch.cat(outs, 1).index_select(1, self.inverse)
        return y.unflatten(2, self.patches.out_hw)


def onnx_ready(model):
    """A copy of `model` with every Adder2d / QAdder2d replaced by its standard-op twin."""
    check_supported(model, "ONNX export")
    model = copy.deepcopy(model).float().eval()
    for name, m in list(model.named_modules()):
        if isinstance(m, Adder2d):
            replace_module(model, name, OnnxAdder2d(m))
        elif isinstance(m, QAdder2d):
            replace_module(model, name, OnnxQAdder2d(m))
    return model


# 17: the first opset with every operator used here; 20: the highest torch.onnx.export's TorchScript exporter writes
OPSETS = range(17, 21)


def check_opset(opset):
    """ConfigError unless ``opset`` is one of OPSETS."""
    if int(opset) not in OPSETS:
        raise ConfigError(
            f"opset={opset} cannot be written: use {OPSETS[0]} to {OPSETS[-1]} (the operators used need {OPSETS[0]}; "
            f"torch's TorchScript exporter writes up to {OPSETS[-1]})."
        )


def export_onnx(model, path, example, opset=17):
    """Write `model` to `path` as ONNX (input "images", output "logits", dynamic batch); checks the file."""
    import onnx

    check_opset(opset)
    ready = onnx_ready(model)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter (see the docstring)
        torch.onnx.export(
            ready,
            (example,),
            str(path),
            dynamo=False,
            opset_version=int(opset),
            input_names=["images"],
            output_names=["logits"],
            dynamic_axes={"images": {0: "batch"}, "logits": {0: "batch"}},
        )
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    return path
