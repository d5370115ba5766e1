"""Multiplications, additions and energy of one forward pass, counted by hooks on a meta-device run.

Conventions (per image, inference):
- convolution / linear: MACs = outputs x (in_channels/groups x kh x kw); #Mul = #Add = MACs
  (the paper's convention; the bias, if any, adds one addition per output);
- adder layer: #Mul = 0, #Add = 2 x MACs (|x - w| as one addition, the accumulation as another);
- batch norm: folded into one scale and one shift, 1 Mul + 1 Add per element;
- pooling: max-pool counts window-1 comparisons per output as additions; average pool counts
  window-1 additions and 1 multiplication (by 1/window) per output;
- residual sum: 1 addition per element; activations (ReLU, GELU, ...), flatten, dropout: none;
- AdderLinear: as an adder layer with in_features per output; layer norm: 3 Mul + 4 Add per element
  (mean, centring, square, variance sum, normalising scale, affine scale and shift);
- attention, per head with N tokens of d channels: scores N*N*d MACs (dot) or 2*N*N*d additions (L1),
  N*N Mul for the 1/tau scale, N*N Add + N*N Mul for the softmax's sum and division (exp not counted),
  A V N*N*d MACs (or 2*N*N*d additions when it is an adder), N*d additions for the identity A + I.

The "paper convention" figure is the convolution and fully connected layers only (BN, pooling and
residual sums omitted), each counted as the operation it performs in the model: the AdderNet
paper's tables (and the ResNet paper's FLOPs its ImageNet rows quote) count every convolution,
stem included. In an AdderNet the stem and classifier stay multiplicative, so its #Mul is small
but not 0 as the paper rounds it.

The forward pass runs on the meta device (shapes only, no arithmetic: Adder2d's fake kernel gives
the output shape), so even ResNet-50 at 224x224 counts in a second.

Energy: 45 nm, 32-bit float, from M. Horowitz, "Computing's energy problem (and what we can do
about it)", ISSCC 2014: 3.7 pJ per multiplication, 0.9 pJ per addition.
"""

import copy
import inspect

import torch
import torch.nn as nn
import torchvision.models as tvm

from ..models import MODELS, build_model
from ..models.attention import AdderAttention
from ..models.blocks import RESIDUAL_BLOCKS
from ..models.vit import Block as VitBlock
from ..ops import ADDER_MODULES, AdderLinear

MUL_PJ, ADD_PJ = 3.7, 0.9
ENERGY_SOURCE = (
    'M. Horowitz, "Computing\'s energy problem (and what we can do about it)", '
    "ISSCC 2014: 45 nm, 32-bit float, 3.7 pJ per multiplication, 0.9 pJ per addition"
)

# The AdderNet paper's (#Mul, #Add) per image (Tables 1-3; MNIST from Sec. 4.1), and the input side it is for.
PAPER_OPS = {
    ("lenet5_bn", "conv"): (435e3, 435e3, 28),
    ("lenet5_bn", "adder"): (0, 870e3, 28),
    ("resnet20", "conv"): (41.17e6, 41.17e6, 32),
    ("resnet20", "adder"): (0, 82.34e6, 32),
    ("resnet32", "conv"): (69.12e6, 69.12e6, 32),
    ("resnet32", "adder"): (0, 138.24e6, 32),
    ("vgg_small", "conv"): (0.65e9, 0.65e9, 32),
    ("vgg_small", "adder"): (0, 1.30e9, 32),
    ("resnet18", "conv"): (1.8e9, 1.8e9, 224),
    ("resnet18", "adder"): (0, 3.6e9, 224),
    ("resnet50", "conv"): (3.9e9, 3.9e9, 224),
    ("resnet50", "adder"): (0, 7.7e9, 224),
}

PARTS = {
    "body": "adder/conv body layers",
    "stem_classifier": "stem + classifier",
    "batchnorm": "batch norm",
    "pooling": "pooling",
    "residual": "residual sums",
    "layernorm": "layer norm",
    "attention": "attention scores, softmax, A V",
}
_NO_OPS = (
    nn.ReLU,
    nn.ReLU6,
    nn.GELU,
    nn.SiLU,
    nn.Hardswish,
    nn.Hardsigmoid,
    nn.Sigmoid,
    nn.Identity,
    nn.Flatten,
    nn.Dropout,
)
# block type -> residual sums per output element (torchvision's residual blocks, the ViT block's two sums)
_RESIDUALS = {
    **{b: 1 for b in RESIDUAL_BLOCKS},
    tvm.resnet.BasicBlock: 1,
    tvm.resnet.Bottleneck: 1,
    VitBlock: 2,
    tvm.mobilenetv2.InvertedResidual: lambda m: int(m.use_res_connect),
}


def _macs(m, y):
    """Multiply-accumulates of a convolution-like layer for output y (batch 1)."""
    if isinstance(m, (nn.Linear, AdderLinear)):
        return y.numel() * m.in_features
    kh, kw = m.kernel_size
    return y.numel() * (m.in_channels // m.groups) * kh * kw


_POOLS = (nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d)


def _kind(m):
    """Which part a leaf module's arithmetic belongs to: "weight", "batchnorm", "pooling" or None."""
    if isinstance(m, (*ADDER_MODULES, nn.Conv2d, nn.Linear)):
        return "weight"
    if isinstance(m, nn.LayerNorm):
        return "layernorm"
    if isinstance(m, nn.modules.batchnorm._BatchNorm):
        return "batchnorm"
    if isinstance(m, _POOLS):
        return "pooling"
    if isinstance(m, _NO_OPS):
        return None
    raise ValueError(f"op counting has no rule for {type(m).__name__}; add one to {__name__}._layer_ops")


def _layer_ops(m, x, y):
    """(mul, add) of one call of leaf module m on input x with output y (batch 1)."""
    bias = y.numel() if getattr(m, "bias", None) is not None else 0
    if isinstance(m, ADDER_MODULES):
        return 0, 2 * _macs(m, y) + bias
    if isinstance(m, nn.LayerNorm):
        return 3 * y.numel(), 4 * y.numel()
    if isinstance(m, (nn.Conv2d, nn.Linear)):
        macs = _macs(m, y)
        return macs, macs + bias
    if isinstance(m, nn.modules.batchnorm._BatchNorm):
        return y.numel(), y.numel()
    if isinstance(m, _POOLS):
        if isinstance(m, nn.AdaptiveAvgPool2d):
            window = x.numel() // y.numel()
        else:
            k = m.kernel_size if isinstance(m.kernel_size, tuple) else (m.kernel_size,) * 2
            window = k[0] * k[1]
        mul = 0 if isinstance(m, nn.MaxPool2d) else y.numel()
        return mul, (window - 1) * y.numel()
    return 0, 0


def attention_ops(m, x):
    """(mul, add) of one AdderAttention call on x (1, N, dim), projections excluded (they are leaf layers)."""
    n, h, d = x.shape[1], m.heads, m.head_dim
    nnd, nn_ = h * n * n * d, h * n * n
    mul, add = (nnd, nnd) if m.scores == "dot" else (0, 2 * nnd)
    mul, add = mul + 2 * nn_, add + nn_  # 1/tau, softmax sum and division
    mul, add = (mul + nnd, add + nnd) if m.value == "product" else (mul, add + 2 * nnd)
    return mul, add + (h * n * d if m.identity == "add" else 0)


def _zero():
    return {"params": 0, "mul": 0, "add": 0}


def _finish(c):
    c["energy_uj"] = float(f"{(c['mul'] * MUL_PJ + c['add'] * ADD_PJ) * 1e-6:.10g}")
    return c


def count_ops(model, input_size, body=None):
    """Count parameters, multiplications and additions of `model` for one input of `input_size` (C, H, W).

    `body`: names of the layers that an AdderNet replaces (its Adder2d and AdderLinear layers; in a CNN twin,
    the convolutions and linear layers at those names); default: the model's adder layers. Returns a dict with one
    entry per part (see PARTS) plus "total" (whole network) and "paper" (convolution and fully
    connected layers only), each {"params", "mul", "add", "energy_uj"}.
    """
    if body is None:
        body = [n for n, m in model.named_modules() if isinstance(m, ADDER_MODULES)]
    body = set(body)
    meta = copy.deepcopy(model).to("meta").eval()
    parts = {p: _zero() for p in PARTS}
    names = {m: n for n, m in meta.named_modules()}
    missing = body - set(names.values())
    if missing:
        raise ValueError(f"body layers not in the model: {sorted(missing)}")

    def part_of(m):
        kind = _kind(m)
        if kind == "weight":
            return "body" if names[m] in body else "stem_classifier"
        return kind

    def leaf_hook(m, inputs, y):
        part = part_of(m)
        if part is not None:
            mul, add = _layer_ops(m, inputs[0], y)
            parts[part]["mul"] += mul
            parts[part]["add"] += add

    def block_hook(m, inputs, y):
        sums = _RESIDUALS[type(m)]
        parts["residual"]["add"] += (sums(m) if callable(sums) else sums) * y.numel()

    def attention_hook(m, inputs, y):
        mul, add = attention_ops(m, inputs[0])
        parts["attention"]["mul"] += mul
        parts["attention"]["add"] += add

    handles = []
    for m in meta.modules():
        if type(m) in _RESIDUALS:
            handles.append(m.register_forward_hook(block_hook))
        if isinstance(m, AdderAttention):
            handles.append(m.register_forward_hook(attention_hook))
        if not list(m.children()):
            handles.append(m.register_forward_hook(leaf_hook))
            params = sum(p.numel() for p in m.parameters(recurse=False))
            if params:
                parts[part_of(m)]["params"] += params
    with torch.no_grad():
        meta(torch.empty(1, *input_size, device="meta"))
    for h in handles:
        h.remove()

    result = {p: _finish(c) for p, c in parts.items()}
    result["total"] = _finish({k: sum(c[k] for c in parts.values()) for k in ("params", "mul", "add")})
    result["paper"] = _finish({k: parts["body"][k] + parts["stem_classifier"][k] for k in ("params", "mul", "add")})
    return result


def count_model_ops(name, layer="adder", num_classes=10, in_channels=None, image_size=32, **options):
    """count_ops for a model of the zoo, with its body layers taken from the adder form.

    Returns the count_ops dict plus "model", "layer", "input" and "paper_table" (the paper's
    {"mul", "add"} for this model and form, or None when it has none at this input size). `options`: the
    model's own keyword arguments (build_model).
    """
    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    if "image_size" in inspect.signature(MODELS[name][0]).parameters:  # a model built for one input size (vit)
        options = {**options, "image_size": size[0]}
    with torch.device("meta"):
        adder = build_model(name, "adder", num_classes, in_channels, **options)
        model = adder if layer == "adder" else build_model(name, layer, num_classes, in_channels, **options)
    body = [n for n, m in adder.named_modules() if isinstance(m, ADDER_MODULES)]
    in_ch = in_channels or MODELS[name][2]
    paper = PAPER_OPS.get((name, layer))
    paper = paper if paper and size == (paper[2], paper[2]) else None
    return {
        "model": name,
        "layer": layer,
        "input": [1, in_ch, *size],
        **count_ops(model, (in_ch, *size), body),
        "paper_table": {"mul": paper[0], "add": paper[1]} if paper else None,
        "pj_per_mul": MUL_PJ,
        "pj_per_add": ADD_PJ,
        "energy_source": ENERGY_SOURCE,
    }


def _si(n):
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:g}"


def _dev(ours, paper):
    return f"{100 * (ours - paper) / paper:+.1f}%" if paper else "-"


def format_report(r):
    """Human-readable table of a count_model_ops result."""
    rows = [(label, r[p]) for p, label in PARTS.items()]
    rows += [("whole network", r["total"]), ("paper convention (conv+fc)", r["paper"])]
    head = f"{'part':<28}{'params':>12}{'#Mul':>10}{'#Add':>10}{'energy uJ':>11}"
    lines = [f"{r['model']} layer={r['layer']}, one input {'x'.join(map(str, r['input'][1:]))}", head, "-" * len(head)]
    lines += [
        f"{label:<28}{c['params']:>12,}{_si(c['mul']):>10}{_si(c['add']):>10}{c['energy_uj']:>11.2f}"
        for label, c in rows
    ]
    if r["paper_table"]:
        p = r["paper_table"]
        lines.append(
            f"{'paper table':<28}{'':>12}{_si(p['mul']):>10}{_si(p['add']):>10}"
            f"   (ours vs paper: #Mul {_dev(r['paper']['mul'], p['mul'])}, "
            f"#Add {_dev(r['paper']['add'], p['add'])})"
        )
    elif (r["model"], r["layer"]) in PAPER_OPS:
        side = PAPER_OPS[r["model"], r["layer"]][2]
        lines.append(f"paper table: given for {side}x{side} inputs (pick the matching data=..., e.g. data=imagenet)")
    lines.append(f"energy: {r['energy_source']}")
    return "\n".join(lines)
