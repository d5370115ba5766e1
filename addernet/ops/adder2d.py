"""Adder2d: convolution with the negative L1 distance instead of the dot product.

    Y[n,o,y,x] = -sum_{c,i,j} |Xpad[n, g(o)*Cin_g + c, y*s + i*d, x*s + j*d] - W[o,c,i,j]| (+ bias[o])

with zero padding counting as input 0. Backward (paper Eq. 5 and 7): dL/dW = sum g * (X - W)
(full precision) and dL/dX = sum g * HardTanh(W - X); no adaptive learning rate here.

Backend, chosen at every call: inside ``with use_backend(name)`` (how a training run applies trainer.backend,
which defaults to the variable, and records it) that one, else the environment variable ADDERNET_BACKEND,
which the package only reads:
  fast (default)  CPU: compiled C kernel (kernels/cpu.py); CUDA: Triton (kernels/triton.py);
                  falls back to eager with a one-line warning when that is unavailable.
  eager           chunked PyTorch, bounded memory, any device (kernels/eager.py).
  reference       the unfold formulation with its own autograd (reference.py); slow, for checks.
Every kernel module provides
    forward(x, w, stride, padding, dilation, groups) -> y                     # -sum|x - w|, no bias
    grad_input(x, w, grad_out, stride, padding, dilation, groups) -> grad_x   # sum g*HardTanh(w - x)
with stride/padding/dilation int 2-tuples. The weight gradient is shared by all backends through
    sum g*(X - W) = conv2d weight-gradient(X, g) - W * sum_{n,y,x} g,
exact because zero padding counts as X = 0. A kernel module may also provide
    grad_input_weight(x, w, grad_out, ...) -> (grad_x, sum g*X or None)       # both gradients in one pass
whose input-gradient pass sums the product term as it goes (the CPU kernel, for weights up to a size): a
backward that needs both gradients then makes no separate convolution weight-gradient pass. fast and eager
are torch.library custom ops (the eager kernel on any device, each device's fast kernel registered for it), so
torch.compile treats them as opaque calls. Argument checks, output size and compute dtype are shared by all of
them (conv_args.py); the backend table is BACKENDS below.
"""

import contextlib
import contextvars
import functools
import os
import warnings

import torch
import torch.nn as nn
from torch.nn.modules.utils import _pair

from .conv_args import as_dtype, check_args, check_inputs, compute_dtype, out_hw, output_format, padding_arg
from .kernels import build, cpu, eager
from .reference import adder2d_reference


@functools.lru_cache(maxsize=None)
def _cpu_kernels():
    instead = "using the slower eager PyTorch kernel (install a C compiler or set CC to enable it)"
    return build.built_or(cpu, eager, "fast CPU adder kernel", instead)


@functools.lru_cache(maxsize=None)
def _cuda_kernels():
    try:
        from .kernels import triton as kernels  # lazily: Triton is optional and slow to import

        if kernels.available():
            return kernels
        reason = "Triton reports it unavailable"
    except ImportError as e:
        reason = str(e)
    warnings.warn(
        f"addernet: Triton adder kernel unavailable ({reason}); using the slower eager PyTorch kernel on CUDA",
        RuntimeWarning,
    )
    return eager


# backend "fast": the kernel module per device type (loaded on first use); other devices run eager
_FAST_KERNELS = {"cpu": _cpu_kernels, "cuda": _cuda_kernels}


def _kernels(device, backend):
    """The kernel module for `backend` ("fast" or "eager") on `device`."""
    loader = _FAST_KERNELS.get(device.type) if backend == "fast" else None
    return loader() if loader else eager


def _forward(kernels, x, weight, stride, padding, dilation, groups):
    y = kernels.forward(x, weight, tuple(stride), tuple(padding), tuple(dilation), groups)
    return _like_input(y, x)


def _grad_input(kernels, x, weight, grad_out, stride, padding, dilation, groups):
    gx = kernels.grad_input(x, weight, grad_out, tuple(stride), tuple(padding), tuple(dilation), groups)
    return _like_input(gx, x)


def _like_input(t, x):
    """A kernel's result t in x's dtype and output memory format (the eager kernel returns contiguous NCHW); t itself
    where it already is (the CPU and Triton kernels' results), with no copy and no torch call for the dtype."""
    return as_dtype(t, x.dtype).contiguous(memory_format=output_format(x))


@torch.library.custom_op("addernet::adder2d_forward", mutates_args=())
def _forward_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    backend: str,
) -> torch.Tensor:
    """y = -sum|x - w| on a device without a kernel of its own: the eager kernel."""
    return _forward(eager, x, weight, stride, padding, dilation, groups)


@_forward_op.register_fake
def _(x, weight, stride, padding, dilation, groups, backend):
    shape = (x.shape[0], weight.shape[0], *out_hw(x.shape, weight.shape, stride, padding, dilation))
    return torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=output_format(x))


@torch.library.custom_op("addernet::adder2d_grad_input", mutates_args=())
def _grad_input_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    grad_out: torch.Tensor,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    backend: str,
) -> torch.Tensor:
    """sum g * HardTanh(w - x) on a device without a kernel of its own: the eager kernel."""
    return _grad_input(eager, x, weight, grad_out, stride, padding, dilation, groups)


@_grad_input_op.register_fake
def _(x, weight, grad_out, stride, padding, dilation, groups, backend):
    return torch.empty_like(x, memory_format=output_format(x))


@torch.library.custom_op("addernet::adder2d_grad_input_weight", mutates_args=())
def _grad_input_weight_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    grad_out: torch.Tensor,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dL/dX, sum g*X) on a device without a kernel of its own: the eager kernel and the convolution weight
    gradient. The weight gradient's W * sum g term is left to the caller (_weight_grad)."""
    return _grad_input_weight(eager, x, weight, grad_out, stride, padding, dilation, groups)


@_grad_input_weight_op.register_fake
def _(x, weight, grad_out, stride, padding, dilation, groups, backend):
    product = torch.empty(weight.shape, dtype=compute_dtype(x.dtype), device=weight.device)
    return torch.empty_like(x, memory_format=output_format(x)), product


def _register(device):
    """The device's own implementations of the ops: its fast kernel for backend "fast", else eager."""

    @_forward_op.register_kernel(device)
    def _(x, weight, stride, padding, dilation, groups, backend):
        return _forward(_kernels(x.device, backend), x, weight, stride, padding, dilation, groups)

    @_grad_input_op.register_kernel(device)
    def _(x, weight, grad_out, stride, padding, dilation, groups, backend):
        return _grad_input(_kernels(x.device, backend), x, weight, grad_out, stride, padding, dilation, groups)

    @_grad_input_weight_op.register_kernel(device)
    def _(x, weight, grad_out, stride, padding, dilation, groups, backend):
        kernels = _kernels(x.device, backend)
        return _grad_input_weight(kernels, x, weight, grad_out, stride, padding, dilation, groups)


for _device in _FAST_KERNELS:
    _register(_device)


def grad_weight(x, weight, grad_out, stride, padding, dilation, groups):
    """dL/dW = sum g*(X - W) = conv weight-gradient(X, g) - W * sum_{n,y,x} g (fp32 for half inputs).
    A 1x1 convolution with stride 1 and no padding on a channels-last input or a single image (AdderLinear's
    rows, l1_scores' keys) is a matrix product per group: its weight gradient is one batched GEMM on views of X
    and g, where aten's convolution backward would copy both and take its slow path."""
    return _weight_grad(_weight_product(x, weight, grad_out, stride, padding, dilation, groups), weight, grad_out)


def _weight_product(x, weight, grad_out, stride, padding, dilation, groups):
    """The weight gradient's product term sum g*X (the convolution weight gradient), in the compute dtype."""
    dt = compute_dtype(x.dtype)
    x, w, g = as_dtype(x, dt), as_dtype(weight, dt), as_dtype(grad_out, dt)
    pointwise = w.shape[2:] == (1, 1) and tuple(stride) == (1, 1) and tuple(padding) == (0, 0)
    if pointwise and (x.shape[0] == 1 or output_format(x) == torch.channels_last):
        xm = x.transpose(0, 1).reshape(groups, x.shape[1] // groups, -1)  # (G, Cg, N*H*W)
        gm = g.transpose(0, 1).reshape(groups, g.shape[1] // groups, -1)  # (G, Og, N*H*W)
        return torch.bmm(gm, xm.transpose(1, 2)).view(w.shape)
    return torch.ops.aten.convolution_backward(
        g, x, w, None, list(stride), list(padding), list(dilation), False, [0, 0], groups, [False, True, False]
    )[1]


def _weight_grad(product, weight, grad_out):
    """dL/dW from its product term sum g*X (in the compute dtype): minus W * sum g, in the weight's dtype."""
    w, g = as_dtype(weight, product.dtype), as_dtype(grad_out, product.dtype)
    return as_dtype(product - w * g.sum((0, 2, 3)).view(-1, 1, 1, 1), weight.dtype)


def _grad_input_weight(kernels, x, weight, grad_out, stride, padding, dilation, groups):
    """(dL/dX, the weight gradient's product term sum g*X): in one pass where the kernel module has grad_input_weight
    (the CPU kernel's input gradient sums g*X as it goes, for weights up to a size), else in two."""
    conf = (tuple(stride), tuple(padding), tuple(dilation), groups)
    fused = getattr(kernels, "grad_input_weight", None)
    gx, product = fused(x, weight, grad_out, *conf) if fused else (kernels.grad_input(x, weight, grad_out, *conf), None)
    if product is None:
        product = _weight_product(x, weight, grad_out, stride, padding, dilation, groups)
    return _like_input(gx, x), product


def _setup_context(ctx, inputs, output):
    x, weight, *conf = inputs
    ctx.save_for_backward(x, weight)
    ctx.conf = conf


def _backward(ctx, grad_out):
    x, weight = ctx.saved_tensors
    stride, padding, dilation, groups, backend = ctx.conf
    gx = gw = None
    if ctx.needs_input_grad[0] and ctx.needs_input_grad[1]:
        gx, product = _grad_input_weight_op(x, weight, grad_out, stride, padding, dilation, groups, backend)
        gw = _weight_grad(product, weight, grad_out)
    elif ctx.needs_input_grad[0]:
        gx = _grad_input_op(x, weight, grad_out, stride, padding, dilation, groups, backend)
    elif ctx.needs_input_grad[1]:
        gw = grad_weight(x, weight, grad_out, stride, padding, dilation, groups)
    return gx, gw, None, None, None, None, None


_forward_op.register_autograd(_backward, setup_context=_setup_context)


def _custom_op(backend):
    def run(x, weight, stride, padding, dilation, groups):
        return _forward_op(x, weight, list(stride), list(padding), list(dilation), groups, backend)

    return run


# backend name -> y = -sum|x - w| (no bias), differentiable; the rule picking one is _backend()
BACKENDS = {"fast": _custom_op("fast"), "eager": _custom_op("eager"), "reference": adder2d_reference}

# the backend use_backend chose for this thread / task; None: $ADDERNET_BACKEND decides
_chosen = contextvars.ContextVar("addernet_backend", default=None)


def _backend():
    """The backend of this call: use_backend's choice, else $ADDERNET_BACKEND, else fast."""
    name = _chosen.get()
    if name is not None:
        return name
    name = os.environ.get("ADDERNET_BACKEND", "fast").strip().lower() or "fast"
    if name not in BACKENDS:
        raise ValueError(f"ADDERNET_BACKEND={name!r} is not a backend; use one of {', '.join(BACKENDS)}")
    return name


@contextlib.contextmanager
def use_backend(name):
    """Run the adder layers inside the block on backend ``name`` (how a run applies trainer.backend), whatever
    $ADDERNET_BACKEND says; the environment is left as it is."""
    if name not in BACKENDS:
        raise ValueError(f"adder backend {name!r} is not one of {', '.join(BACKENDS)}")
    token = _chosen.set(name)
    try:
        yield
    finally:
        _chosen.reset(token)


def kernel_in_use(device):
    """The kernel module the current backend runs on ``device``: cpu (C), triton, eager or reference."""
    backend = _backend()
    return "reference" if backend == "reference" else _kernels(torch.device(device), backend).__name__.rsplit(".")[-1]


def adder2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """Functional adder convolution; same argument forms as torch.nn.functional.conv2d (no string
    padding other than 'valid'): a batch (N, C, H, W), or one unbatched image (C, H, W) giving (O, H', W').

    Under autocast (bf16 or fp16) the layer runs in float32, whatever the input dtype, and returns
    float32: its outputs are large (about 1e4 for a 3x3x64 filter) and the following BatchNorm
    subtracts a mean of the same size, so an output rounded to bf16 (8 bits of mantissa: steps of
    64 at 1e4) turns into noise after normalisation. A float32 output also keeps that BatchNorm in
    float32. Outside autocast, float16/bfloat16 inputs are accumulated in float32 and returned in
    their own dtype."""
    if isinstance(input, torch.Tensor) and input.dim() == 3:  # one unbatched (C, H, W) image, as conv2d takes it
        return adder2d(input.unsqueeze(0), weight, bias, stride, padding, dilation, groups).squeeze(0)
    if isinstance(input, torch.Tensor) and input.dim() != 4:
        raise ValueError(f"adder2d expects a batch (N, C, H, W) or one image (C, H, W), got shape {tuple(input.shape)}")
    stride, padding, dilation = _pair(stride), padding_arg(padding), _pair(dilation)
    check_args(stride=stride, padding=padding, dilation=dilation)
    if isinstance(input, torch.Tensor) and input.device.type != "meta" and torch.is_autocast_enabled(input.device.type):
        input, weight = input.float(), weight.float()
        bias = None if bias is None else bias.float()
    check_inputs(input, weight, stride, padding, dilation, groups, bias)
    y = BACKENDS[_backend()](input, weight, stride, padding, dilation, groups)
    return y if bias is None else y + bias.view(1, -1, 1, 1)


class AdderParameters(nn.Module):
    """The parameters every adder layer has: a weight drawn N(0, 1), as in the official AdderNet models, and an
    optional bias starting at zero (off by default: an adder layer feeds a normalisation layer)."""

    def make_parameters(self, weight_shape, bias, device=None, dtype=None):
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(*weight_shape, **factory))
        self.bias = nn.Parameter(torch.empty(weight_shape[0], **factory)) if bias else None
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.normal_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)


class Adder2d(AdderParameters):
    """Drop-in for nn.Conv2d computing Y = -sum|X - W| (+ bias), with the paper's gradients.

    The weight is initialised N(0, 1), as in the official AdderNet models; bias (off by default)
    starts at zero. Only padding_mode='zeros' exists (zero padding counts as input 0).
    """

    def __init__(
        self,
        in_channels,
        out_channels,
        kernel_size,
        stride=1,
        padding=0,
        dilation=1,
        groups=1,
        bias=False,
        padding_mode="zeros",
        device=None,
        dtype=None,
    ):
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
        self.padding, self.dilation = padding_arg(padding), _pair(dilation)
        check_args(kernel_size=self.kernel_size, stride=self.stride, padding=self.padding, dilation=self.dilation)
        self.padding_mode = padding_mode
        self.make_parameters((out_channels, in_channels // groups, *self.kernel_size), bias, device, dtype)

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
