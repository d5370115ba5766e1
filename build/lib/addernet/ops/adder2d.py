"""Adder2d: convolution with the negative L1 distance instead of the dot product.

    Y[n,o,y,x] = -sum_{c,i,j} |Xpad[n, g(o)*Cin_g + c, y*s + i*d, x*s + j*d] - W[o,c,i,j]| (+ bias[o])

with zero padding counting as input 0. Backward (paper Eq. 5 and 7): dL/dW = sum g * (X - W)
(full precision) and dL/dX = sum g * HardTanh(W - X); no adaptive learning rate here.

Backend (environment variable ADDERNET_BACKEND, read at every call):
  fast (default)  CPU: compiled C kernel (kernels/cpu.py); CUDA: Triton (kernels/triton.py);
                  falls back to eager with a one-line warning when that is unavailable.
  eager           chunked PyTorch, bounded memory, any device (kernels/eager.py).
  reference       the unfold formulation with its own autograd (reference.py); slow, for checks.
Every kernel module provides
    forward(x, w, stride, padding, dilation, groups) -> y                     # -sum|x - w|, no bias
    grad_input(x, w, grad_out, stride, padding, dilation, groups) -> grad_x   # sum g*HardTanh(w - x)
with stride/padding/dilation int 2-tuples. The weight gradient is shared by all backends through
    sum g*(X - W) = conv2d weight-gradient(X, g) - W * sum_{n,y,x} g,
exact because zero padding counts as X = 0. fast and eager are torch.library custom ops, so
torch.compile treats them as opaque calls.
"""
import functools
import os
import warnings

import torch
import torch.nn as nn
from torch.nn.modules.utils import _pair

from .kernels import eager
from .reference import adder2d_reference

BACKENDS = ("fast", "eager", "reference")
_HALF = (torch.float16, torch.bfloat16)


def _backend():
    name = os.environ.get("ADDERNET_BACKEND", "fast").strip().lower() or "fast"
    if name not in BACKENDS:
        raise ValueError(f"ADDERNET_BACKEND={name!r} is not a backend; use one of {', '.join(BACKENDS)}")
    return name


@functools.lru_cache(maxsize=None)
def _cpu_kernels():
    from .kernels import build, cpu

    try:
        cpu.available()
        return cpu
    except build.BuildError as e:
        warnings.warn(f"addernet: fast CPU adder kernel unavailable ({e}); using the slower eager "
                      "PyTorch kernel (install a C compiler or set CC to enable it)", RuntimeWarning)
        return eager


@functools.lru_cache(maxsize=None)
def _cuda_kernels():
    try:
        from .kernels import triton as kernels

        if kernels.available():
            return kernels
        reason = "Triton reports it unavailable"
    except ImportError as e:
        reason = str(e)
    warnings.warn(f"addernet: Triton adder kernel unavailable ({reason}); using the slower eager "
                  "PyTorch kernel on CUDA", RuntimeWarning)
    return eager


def _kernels(device, backend):
    if backend == "eager":
        return eager
    if device.type == "cpu":
        return _cpu_kernels()
    if device.type == "cuda":
        return _cuda_kernels()
    return eager


def _out_hw(x, w, stride, padding, dilation):
    return tuple((x.shape[2 + i] + 2 * padding[i] - dilation[i] * (w.shape[2 + i] - 1) - 1) // stride[i] + 1
                 for i in range(2))


@torch.library.custom_op("addernet::adder2d_forward", mutates_args=())
def _forward_op(x: torch.Tensor, weight: torch.Tensor, stride: list[int], padding: list[int],
                dilation: list[int], groups: int, backend: str) -> torch.Tensor:
    y = _kernels(x.device, backend).forward(x, weight, tuple(stride), tuple(padding), tuple(dilation), groups)
    return y.to(x.dtype).contiguous()


@_forward_op.register_fake
def _(x, weight, stride, padding, dilation, groups, backend):
    return x.new_empty((x.shape[0], weight.shape[0], *_out_hw(x, weight, stride, padding, dilation)))


@torch.library.custom_op("addernet::adder2d_grad_input", mutates_args=())
def _grad_input_op(x: torch.Tensor, weight: torch.Tensor, grad_out: torch.Tensor, stride: list[int],
                   padding: list[int], dilation: list[int], groups: int, backend: str) -> torch.Tensor:
    gx = _kernels(x.device, backend).grad_input(x, weight, grad_out, tuple(stride), tuple(padding),
                                                tuple(dilation), groups)
    return gx.to(x.dtype).contiguous()


@_grad_input_op.register_fake
def _(x, weight, grad_out, stride, padding, dilation, groups, backend):
    return x.new_empty(x.shape)


def grad_weight(x, weight, grad_out, stride, padding, dilation, groups):
    """dL/dW = sum g*(X - W) = conv weight-gradient(X, g) - W * sum_{n,y,x} g (fp32 for half inputs)."""
    dt = torch.float32 if x.dtype in _HALF else x.dtype
    x, w, g = x.to(dt), weight.to(dt), grad_out.to(dt)
    gw = torch.ops.aten.convolution_backward(g, x, w, None, list(stride), list(padding), list(dilation),
                                             False, [0, 0], groups, [False, True, False])[1]
    return (gw - w * g.sum((0, 2, 3)).view(-1, 1, 1, 1)).to(weight.dtype)


def _setup_context(ctx, inputs, output):
    x, weight, *conf = inputs
    ctx.save_for_backward(x, weight)
    ctx.conf = conf


def _backward(ctx, grad_out):
    x, weight = ctx.saved_tensors
    stride, padding, dilation, groups, backend = ctx.conf
    gx = gw = None
    if ctx.needs_input_grad[0]:
        gx = _grad_input_op(x, weight, grad_out, stride, padding, dilation, groups, backend)
    if ctx.needs_input_grad[1]:
        gw = grad_weight(x, weight, grad_out, stride, padding, dilation, groups)
    return gx, gw, None, None, None, None, None


_forward_op.register_autograd(_backward, setup_context=_setup_context)


def _padding_arg(padding):
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0)
        raise ValueError(f"Adder2d does not support padding={padding!r}; pass explicit integer padding "
                         "(e.g. padding=k // 2 for an odd kernel size k with stride 1)")
    return _pair(padding)


def _check_args(**pairs):
    """Each pair must hold ints >= 0 (padding) or >= 1 (the rest)."""
    for name, v in pairs.items():
        low = 0 if name == "padding" else 1
        if len(v) != 2 or not all(isinstance(e, int) and e >= low for e in v):
            raise ValueError(f"Adder2d {name} must be an int >= {low} or a pair of them, got {v}")


def _check_inputs(x, weight, bias, stride, padding, dilation, groups):
    """Errors as clear as nn.Conv2d's, raised before any kernel runs."""
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"adder2d expects a 4-D input (N, C, H, W), got {shape}; "
                         "for a single image use x.unsqueeze(0)")
    if weight.dim() != 4:
        raise ValueError(f"adder2d expects a 4-D weight (out, in/groups, kh, kw), got {tuple(weight.shape)}")
    if not x.is_floating_point() or x.dtype != weight.dtype:
        raise TypeError(f"adder2d needs floating-point input and weight of the same dtype, got input "
                        f"{x.dtype} and weight {weight.dtype} (use autocast or .to() to match them)")
    if x.device != weight.device:
        raise ValueError(f"adder2d input is on {x.device} but weight is on {weight.device}")
    if not isinstance(groups, int) or groups < 1 or weight.shape[0] % groups:
        raise ValueError(f"adder2d groups={groups} must be a positive int dividing out_channels={weight.shape[0]}")
    if x.shape[1] != weight.shape[1] * groups:
        raise ValueError(f"adder2d expected input with {weight.shape[1] * groups} channels (weight "
                         f"{tuple(weight.shape)} with groups={groups}), but got input of shape {tuple(x.shape)}")
    for i, axis in enumerate(("height", "width")):
        eff = dilation[i] * (weight.shape[2 + i] - 1) + 1
        if x.shape[2 + i] + 2 * padding[i] < eff:
            raise ValueError(f"adder2d padded input {axis} {x.shape[2 + i]} + 2*{padding[i]} is smaller than the "
                             f"effective kernel {axis} {eff} (kernel {weight.shape[2 + i]}, dilation "
                             f"{dilation[i]}); use a smaller kernel, more padding or a larger input")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"adder2d bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")


def adder2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """Functional adder convolution; same argument forms as torch.nn.functional.conv2d (no string
    padding other than 'valid'). Under autocast input, weight and bias are cast to the autocast
    dtype; float16/bfloat16 are accumulated in float32 by the fast and eager backends."""
    stride, padding, dilation = _pair(stride), _padding_arg(padding), _pair(dilation)
    _check_args(stride=stride, padding=padding, dilation=dilation)
    if isinstance(input, torch.Tensor) and input.device.type != "meta" and torch.is_autocast_enabled(input.device.type):
        dt = torch.get_autocast_dtype(input.device.type)
        input, weight = input.to(dt), weight.to(dt)
        bias = None if bias is None else bias.to(dt)
    _check_inputs(input, weight, bias, stride, padding, dilation, groups)
    backend = _backend()
    if backend == "reference":
        y = adder2d_reference(input, weight, stride, padding, dilation, groups)
    else:
        y = _forward_op(input, weight, list(stride), list(padding), list(dilation), groups, backend)
    return y if bias is None else y + bias.view(1, -1, 1, 1)


class Adder2d(nn.Module):
    """Drop-in for nn.Conv2d computing Y = -sum|X - W| (+ bias), with the paper's gradients.

    The weight is initialised N(0, 1), as in the official AdderNet models; bias (off by default)
    starts at zero. Only padding_mode='zeros' exists (zero padding counts as input 0).
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=False, padding_mode="zeros", device=None, dtype=None):
        super().__init__()
        if padding_mode != "zeros":
            raise ValueError(f"Adder2d only supports padding_mode='zeros', got {padding_mode!r}")
        if not isinstance(groups, int) or groups < 1:
            raise ValueError(f"Adder2d groups must be a positive int, got {groups!r}")
        if in_channels % groups:
            raise ValueError(f"Adder2d in_channels={in_channels} must be divisible by groups={groups}")
        if out_channels % groups:
            raise ValueError(f"Adder2d out_channels={out_channels} must be divisible by groups={groups}")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size, self.stride = _pair(kernel_size), _pair(stride)
        self.padding, self.dilation = _padding_arg(padding), _pair(dilation)
        _check_args(kernel_size=self.kernel_size, stride=self.stride, padding=self.padding,
                    dilation=self.dilation)
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
