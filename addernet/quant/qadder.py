"""QAdder2d: a post-training quantised adder layer (one shared scale per group of filters).

State (buffers, so a quantised model's state_dict describes itself; see format.py):
  qweight   (O, Cg, kh, kw) integers q_w: signed (int8 up to 8 bits, else int16) or unsigned (uint8, int32)
  weight_step () the weight grid in activation steps: 2 = signed grid 2s/(2^b-1), 1 = unsigned grid s/(2^b-1)
            (quantizer.py); v = weight_step * q_w are the weights in activation steps
  group     (O,) group of every filter, groups numbered by ascending max |w| (grouping.py)
  scale     (G,) s_g, shared by the weights and the activations of group g
  bias_term (O,) beta of the lossless weight clamp (quantizer.clamp_weight), added before BN
  act_range ()   the calibrated activation range A; bits () the bit width b
Forward, per group g (inputs after a ReLU, so q_a >= 0):
  integer ("int", CPU): sum |q_a - v| = sum |q_a - u| + c with u = max(v, 0) and
      c = sum max(-v, 0) per filter (exact because q_a >= 0), so both operands are unsigned
      b-bit integers (uint8 lanes up to 8 bits) for the kernel ops/kernels/adder_int.c;
      y = -(s_g / (2^b-1)) (sum + c) + beta.
  float ("fake", any device): y = adder2d(x_hat, w_hat) + beta on the dequantised tensors.
Both give the same values up to float rounding; "auto" picks int on CPU when the kernel builds.
A sample holding NaN/inf gives NaN outputs (quantising would clamp it to a finite level), as in the float layer.
"""

import functools

import torch
import torch.nn as nn

from ..ops import adder2d
from ..ops.kernels import build, int_cpu
from .quantizer import grid_step, lane, levels, quantize_activation, unsigned_form, weight_dtype

KERNELS = ("auto", "int", "fake")


@functools.lru_cache(maxsize=None)
def _int_kernel():
    """The integer kernel module, or None (with one warning) when it cannot be built."""
    instead = "quantised layers compute in float (the same values up to rounding)"
    return build.built_or(int_cpu, None, "integer adder kernel", instead)


def nan_where_not_finite(x, y):
    """`y` with NaN in every sample (first dimension) whose input `x` holds a NaN or an infinity."""
    bad = ~torch.isfinite(x.flatten(1).sum(1))  # a NaN or an infinity makes the sum one (a fast first look) ...
    if bool(bad.any()):  # ... as may an overflow of large finite values: those samples are looked at in full
        bad[bad.clone()] = ~torch.isfinite(x[bad].flatten(1)).all(1)
    return torch.where(bad.view(-1, *[1] * (y.dim() - 1)), torch.nan, y) if bool(bad.any()) else y


class QAdder2d(nn.Module):
    def __init__(
        self,
        in_channels,
        out_channels,
        kernel_size,
        stride,
        padding,
        dilation,
        groups,
        bits,
        n_groups,
        kernel="auto",
        grid="signed",
    ):
        super().__init__()
        if kernel not in KERNELS:
            raise ValueError(f"quant.kernel={kernel!r}: choose one of {', '.join(KERNELS)}")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size, self.stride, self.padding, self.dilation = kernel_size, stride, padding, dilation
        self.kernel = kernel
        wdtype = weight_dtype(bits, grid)
        self.register_buffer("qweight", torch.zeros(out_channels, in_channels // groups, *kernel_size, dtype=wdtype))
        self.register_buffer("weight_step", torch.tensor(grid_step(grid)))
        self.register_buffer("group", torch.zeros(out_channels, dtype=torch.int64))
        self.register_buffer("scale", torch.ones(n_groups))
        self.register_buffer("bias_term", torch.zeros(out_channels))
        self.register_buffer("act_range", torch.tensor(1.0))
        self.register_buffer("bits", torch.tensor(int(bits)))

    @classmethod
    def like(cls, adder, bits, n_groups, kernel="auto", grid="signed"):
        """An empty quantised twin of Adder2d `adder` (same geometry), to be filled or loaded."""
        return cls(
            adder.in_channels,
            adder.out_channels,
            adder.kernel_size,
            adder.stride,
            adder.padding,
            adder.dilation,
            adder.groups,
            bits,
            n_groups,
            kernel,
            grid,
        )

    @property
    def grid(self):
        """ "unsigned" or "signed": the weight grid (quant.weight_grid)."""
        return "unsigned" if int(self.weight_step) == 1 else "signed"

    def grid_weights(self):
        """The integer weights in activation steps, v = weight_step * q_w (int32): w_hat = v s/(2^b-1)."""
        return self.qweight.to(torch.int32) * int(self.weight_step)

    def _blocks(self):
        """(group, filter indices, input-channel slice) per quant group and conv group with members."""
        cg, og = self.in_channels // self.groups, self.out_channels // self.groups
        for g in range(self.scale.numel()):
            for h in range(self.groups):
                idx = torch.nonzero(self.group[h * og : (h + 1) * og] == g).flatten() + h * og
                if idx.numel():
                    yield g, idx, slice(h * cg, (h + 1) * cg)

    def _plan(self):
        """Per block: (scale, filter indices or None for all in order, channel slice, u, c, packed u).

        Groups with equal scales share one quantised input and one kernel call (on the official
        ResNet-20 every group has s_g = A). Cached until a buffer changes (e.g. load_state_dict)."""
        key = tuple((t.data_ptr(), t._version) for t in (self.qweight, self.group, self.scale, self.weight_step))
        if getattr(self, "_plan_key", None) == key:
            return self._plan_cache
        dtype = lane(self.bits)
        merged = {}
        for g, idx, chans in self._blocks():
            k = (float(self.scale[g]), chans.start)
            merged[k] = (g, torch.cat([merged[k][1], idx]) if k in merged else idx, chans)
        plan = []
        q_w = self.grid_weights()
        for g, idx, chans in merged.values():
            idx = idx.sort().values
            u, c = unsigned_form(q_w[idx])
            u, c = u.to(dtype), c.view(1, -1, 1, 1)
            packed = int_cpu.pack_weight(u, 1) if _int_kernel() is not None else None
            whole = idx.numel() == self.out_channels
            plan.append((self.scale[g].clone(), None if whole else idx, chans, q_w[idx].float(), c, u, packed))
        self._plan_key, self._plan_cache = key, plan
        return plan

    def _use_int(self, x):
        if self.kernel == "fake" or x.device.type != "cpu":
            if self.kernel == "int":
                raise RuntimeError(
                    f"quant.kernel=int runs on CPU only; use quant.kernel=auto or fake on {x.device.type}"
                )
            return False
        return _int_kernel() is not None

    def forward(self, x):
        bits, lv = int(self.bits), levels(int(self.bits))
        x = x.float()
        use_int = self._use_int(x)
        conf = (self.stride, self.padding, self.dilation)
        if self.kernel_size == (1, 1) and self.padding == (0, 0) and self.stride != (1, 1):
            x, conf = (
                x[:, :, :: self.stride[0], :: self.stride[1]],
                ((1, 1), (0, 0), (1, 1)),
            )  # quantise only what is read
        dtype = lane(bits)
        outs = []
        for s, idx, chans, w_int, c, u, packed in self._plan():
            xs = x if chans.start == 0 and chans.stop == self.in_channels else x[:, chans]
            a = quantize_activation(xs, s, bits)
            if use_int:
                total = _int_kernel().forward(a.to(dtype), u, *conf, 1, packed) + c
                out = total.float() * (-(s / lv))
            else:
                out = adder2d(a * (s / lv), w_int * (s / lv), None, *conf, 1)  # -sum|x - w|
            bias = self.bias_term if idx is None else self.bias_term[idx]
            outs.append((idx, out + bias.view(1, -1, 1, 1)))
        if len(outs) == 1 and outs[0][0] is None:
            y = outs[0][1]
        else:
            y = outs[0][1].new_empty(x.shape[0], self.out_channels, *outs[0][1].shape[2:])
            for idx, out in outs:
                y[:, idx] = out
        return nan_where_not_finite(x, y)

    def extra_repr(self):
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"padding={self.padding}, bits={int(self.bits)}, groups_of_filters={self.scale.numel()}, "
            f"weight_grid={self.grid}, "
            f"kernel={self.kernel}"
        )
