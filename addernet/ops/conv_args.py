"""The adder convolution's argument rules, written once for the module, the reference and every kernel:
argument normalisation and checks, output size and memory format, and the dtype a kernel computes in.

Errors are raised before any kernel runs and read like nn.Conv2d's: what was wrong, what to do.
"""

import torch
from torch.nn.modules.utils import _pair


def compute_dtype(dtype):
    """The dtype kernels compute (accumulate) in: float64 for float64, float32 for everything else
    (float32, float16, bfloat16)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def as_dtype(t, dtype):
    """t in ``dtype``: t itself where it already is, as Tensor.to returns it, without the torch call (about a
    microsecond, several of which a layer call would pay)."""
    return t if t.dtype == dtype else t.to(dtype)


def output_format(x):
    """Memory format of an output and an input gradient for input x: channels-last when x is (and is not also
    plain contiguous), as torch's convolutions decide; contiguous NCHW otherwise."""
    cl = not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)
    return torch.channels_last if cl else torch.contiguous_format


def out_hw(x_shape, w_shape, stride, padding, dilation):
    """(Ho, Wo) of an NCHW input of shape x_shape under an (out, in/groups, kh, kw) weight."""
    return tuple(
        (x_shape[2 + i] + 2 * padding[i] - dilation[i] * (w_shape[2 + i] - 1) - 1) // stride[i] + 1 for i in range(2)
    )


def padding_arg(padding):
    """Padding as an int pair; of the string forms only 'valid' (= 0) is supported."""
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0)
        raise ValueError(
            f"Adder2d does not support padding={padding!r}; pass explicit integer padding "
            "(e.g. padding=k // 2 for an odd kernel size k with stride 1)"
        )
    return _pair(padding)


def check_args(**pairs):
    """Each pair must hold ints >= 0 (padding) or >= 1 (the rest)."""
    for name, v in pairs.items():
        low = 0 if name == "padding" else 1
        if len(v) != 2 or not all(isinstance(e, int) and e >= low for e in v):
            raise ValueError(f"Adder2d {name} must be an int >= {low} or a pair of them, got {v}")


def check_inputs(x, weight, stride, padding, dilation, groups, bias=None, dtypes=None):
    """Shapes, dtypes and devices of one call; `dtypes` narrows the accepted dtypes for a kernel."""
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(
            f"adder2d expects a 4-D input (N, C, H, W), got {shape}; for a single image use x.unsqueeze(0)"
        )
    if weight.dim() != 4:
        raise ValueError(f"adder2d expects a 4-D weight (out, in/groups, kh, kw), got {tuple(weight.shape)}")
    if not x.is_floating_point() or x.dtype != weight.dtype or (dtypes is not None and x.dtype not in dtypes):
        allowed = f" ({', '.join(str(d).replace('torch.', '') for d in dtypes)})" if dtypes else ""
        raise TypeError(
            f"adder2d needs input and weight of one float dtype{allowed}, the same dtype for both, "
            f"got input {x.dtype} and weight {weight.dtype} (use autocast or .to() to match them)"
        )
    if x.device != weight.device:
        raise ValueError(f"adder2d input is on {x.device} but weight is on {weight.device}")
    if not isinstance(groups, int) or groups < 1 or weight.shape[0] % groups:
        raise ValueError(f"adder2d groups={groups} must be a positive int dividing out_channels={weight.shape[0]}")
    if x.shape[1] != weight.shape[1] * groups:
        raise ValueError(
            f"adder2d channel mismatch: expected input with {weight.shape[1] * groups} channels "
            f"(weight {tuple(weight.shape)} with groups={groups}), but got input of shape "
            f"{tuple(x.shape)}"
        )
    for i, axis in enumerate(("height", "width")):
        eff = dilation[i] * (weight.shape[2 + i] - 1) + 1
        if x.shape[2 + i] + 2 * padding[i] < eff:
            raise ValueError(
                f"adder2d input too small: padded input {axis} {x.shape[2 + i]} + 2*{padding[i]} is "
                f"smaller than the effective kernel {axis} {eff} (kernel {weight.shape[2 + i]}, "
                f"dilation {dilation[i]}); use a smaller kernel, more padding or a larger input"
            )
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"adder2d bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")


def check_grad_out(grad_out, x, weight, stride, padding, dilation):
    """The output gradient must have the forward output's shape and x's device."""
    expected = (x.shape[0], weight.shape[0], *out_hw(x.shape, weight.shape, stride, padding, dilation))
    if tuple(grad_out.shape) != expected:
        raise ValueError(f"adder2d grad_out has shape {tuple(grad_out.shape)}, expected {expected}")
    if grad_out.device != x.device:
        raise ValueError(f"adder2d grad_out is on {grad_out.device} but x on {x.device}")
