"""adderize: turn any network's convolutions (and optionally linear layers) into adder layers, in place.

    report = adderize(model)              # nn.Conv2d -> Adder2d, except the first conv and the classifier
    print(report)                         # what was replaced, kept, and which adder layers lack a norm

Rules (docs/any_network.md):
- Candidates are the nn.Conv2d modules (and the nn.Linear modules with ``linear=True``), in registration
  order (``model.named_modules()``). ``include`` / ``exclude`` (fnmatch patterns on module names, e.g.
  ``"layer4.*"``) narrow them. The first nn.Conv2d (the stem) and the last conv-or-linear module (the
  classifier) stay multiplicative unless ``keep_first=False`` / ``keep_last=False``, as in the paper.
- A replacement has the same arguments (in/out, kernel, stride, padding, dilation, groups, bias), device and
  dtype, and the adder init (weights N(0, 1), bias 0): convolution weights are not copied, since they do not
  carry over to an L1 distance.
- Every adder layer must feed a normalisation layer: its outputs are sums of absolute differences, all
  negative and of size ~ fan-in (about -1e3 to -1e4), so without a norm the next ReLU zeroes them and the
  logits saturate (the network stays at chance). An adder layer "feeds a norm" when the next module with
  computation after it in registration order (shape-only modules skipped: identity, dropout, flatten,
  unflatten, channel shuffle, torchvision's Permute) is a normalisation layer
  (BatchNorm, SyncBatchNorm, InstanceNorm, GroupNorm, LayerNorm, RMSNorm). ``missing_norm`` says what happens
  otherwise: "warn" (default), "error" (ValueError), "insert" (the layer becomes ``nn.Sequential(adder, norm)``
  with BatchNorm2d after an Adder2d, LayerNorm after an AdderLinear) or "ignore".
- With ``example`` (an input batch or its shape) one forward pass on the meta device (no compute, the model's
  own tensors untouched) checks that the network calls every replaced layer: a network may read a layer's
  ``.weight`` itself (torchvision's Swin calls ``F.linear(x, attn.qkv.weight)``), which would then compute a dot
  product with adder weights. Replaced layers the pass does not call are put back as they were and listed in
  ``report.reverted``, with a warning.
"""

import dataclasses
import fnmatch
import itertools
import warnings

import torch
import torch.nn as nn
from torch.func import functional_call
from torchvision.ops.misc import Permute

from ..errors import ConfigError
from ..ops import ADDER_MODULES, Adder2d, AdderLinear
from .attention import AdderAttention

NORM_TYPES = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm, nn.RMSNorm)
PASS_THROUGH = (nn.Identity, nn.modules.dropout._DropoutNd, nn.Flatten, nn.Unflatten, nn.ChannelShuffle, Permute)
MISSING_NORM = ("warn", "error", "insert", "ignore")


@dataclasses.dataclass
class AdderizeReport:
    """What ``adderize`` did: module names, each list in registration order."""

    replaced: list = dataclasses.field(default_factory=list)  # (name, "Conv2d -> Adder2d")
    kept: list = dataclasses.field(default_factory=list)  # (name, reason): candidates left multiplicative
    skipped: list = dataclasses.field(default_factory=list)  # (name, reason): candidates that cannot convert
    missing_norm: list = dataclasses.field(default_factory=list)  # adder layers that feed no normalisation layer
    inserted: list = dataclasses.field(default_factory=list)  # adder layers given a norm (missing_norm="insert")
    reverted: list = dataclasses.field(default_factory=list)  # (name, why): put back, the network does not call them

    def __str__(self):
        lines = [
            f"adderize: {len(self.replaced)} layer(s) replaced, {len(self.kept)} kept, "
            f"{len(self.skipped)} skipped, {len(self.reverted)} reverted, {len(self.missing_norm)} without a norm"
        ]
        lines += [f"  replaced {n}: {what}" for n, what in self.replaced]
        lines += [f"  reverted {n}: {why}" for n, why in self.reverted]
        lines += [f"  kept     {n}: {why}" for n, why in self.kept]
        lines += [f"  skipped  {n}: {why}" for n, why in self.skipped]
        lines += [f"  no norm  {n}" + (" (norm inserted)" if n in self.inserted else "") for n in self.missing_norm]
        return "\n".join(lines)


def _same_padding(conv):
    """Integer padding of a conv that uses padding='same' or 'valid', or None when not symmetric."""
    if conv.padding == "valid":
        return (0, 0)
    if any(s != 1 for s in conv.stride):
        return None
    total = [d * (k - 1) for d, k in zip(conv.dilation, conv.kernel_size)]
    return None if any(t % 2 for t in total) else tuple(t // 2 for t in total)


def _adder_for(module):
    """(the adder twin of `module`, None) or (None, why it cannot be converted)."""
    factory = {"device": module.weight.device, "dtype": module.weight.dtype}
    bias = module.bias is not None
    if isinstance(module, nn.Linear):
        return AdderLinear(module.in_features, module.out_features, bias=bias, **factory), None
    if module.padding_mode != "zeros":
        return None, f"padding_mode={module.padding_mode!r} (Adder2d pads with zeros only)"
    padding = _same_padding(module) if isinstance(module.padding, str) else module.padding
    if padding is None:
        return None, f"padding={module.padding!r} is asymmetric here (Adder2d takes integer padding)"
    return Adder2d(
        module.in_channels,
        module.out_channels,
        module.kernel_size,
        stride=module.stride,
        padding=padding,
        dilation=module.dilation,
        groups=module.groups,
        bias=bias,
        **factory,
    ), None


def _matches(name, patterns):
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _compute_leaves(model):
    """Leaf modules in registration order, without the shape-only ones (PASS_THROUGH: identity, dropout, permute...)."""
    return [
        (n, m)
        for n, m in model.named_modules()
        if not any(True for _ in m.children()) and not isinstance(m, PASS_THROUGH)
    ]


def adder_layers_without_norm(model):
    """Names of the adder layers (Adder2d, AdderLinear) whose next computing module is not a normalisation layer."""
    leaves = _compute_leaves(model)
    return [
        n
        for i, (n, m) in enumerate(leaves)
        if isinstance(m, ADDER_MODULES) and not (i + 1 < len(leaves) and isinstance(leaves[i + 1][1], NORM_TYPES))
    ]


def _called(model, names, example):
    """The modules among `names` that one training-mode forward of `example` calls (on the meta device)."""
    called, hooks = set(), []
    for name in names:
        hooks.append(model.get_submodule(name).register_forward_hook(lambda m, a, o, n=name: called.add(n)))
    state = {
        n: torch.empty_like(t, device="meta")
        for n, t in itertools.chain(model.named_parameters(), model.named_buffers())
    }
    x = torch.empty(example, device="meta") if isinstance(example, (tuple, list, torch.Size)) else example.to("meta")
    try:
        with torch.no_grad():
            functional_call(model, state, (x,))
    except Exception as e:  # the network's own error: name the input it was given
        raise ValueError(
            f"adderize: the check forward pass on an input of shape {tuple(x.shape)} failed: "
            f"{str(e).splitlines()[0] if str(e) else type(e).__name__}; pass an example input the network takes"
        ) from None
    finally:
        for h in hooks:
            h.remove()
    return called


def adderize(
    model, keep_first=True, keep_last=True, linear=False, include=None, exclude=(), missing_norm="warn", example=None
):
    """Replace the nn.Conv2d (and with ``linear=True`` the nn.Linear) layers of ``model`` by Adder2d (AdderLinear)
    in place; returns an AdderizeReport. Arguments and rules: the module docstring and docs/any_network.md."""
    if not isinstance(model, nn.Module) or isinstance(model, (nn.Conv2d, nn.Linear)):
        raise TypeError(
            f"adderize needs a network (an nn.Module containing layers), got {type(model).__name__}; "
            "for a single layer build Adder2d / AdderLinear directly"
        )
    if missing_norm not in MISSING_NORM:
        raise ValueError(f"adderize missing_norm={missing_norm!r} is not valid; use one of {', '.join(MISSING_NORM)}")
    include = [include] if isinstance(include, str) else include
    exclude = [exclude] if isinstance(exclude, str) else list(exclude or ())
    types = (nn.Conv2d, nn.Linear) if linear else (nn.Conv2d,)
    layers = [(n, m) for n, m in model.named_modules() if type(m) in (nn.Conv2d, nn.Linear)]
    convs = [n for n, m in layers if isinstance(m, nn.Conv2d)]
    first, last = (convs[0] if convs else None), (layers[-1][0] if layers else None)
    report, originals = AdderizeReport(), {}
    for name, module in layers:
        if not isinstance(module, types):
            continue
        if include is not None and not _matches(name, include):
            continue
        reason = (
            "the first convolution (keep_first=True)"
            if keep_first and name == first
            else "the classifier, the last layer (keep_last=True)"
            if keep_last and name == last
            else "matches exclude"
            if _matches(name, exclude)
            else None
        )
        if reason:
            report.kept.append((name, reason))
            continue
        adder, why = _adder_for(module)
        if adder is None:
            report.skipped.append((name, why))
            warnings.warn(f"adderize: {name} stays {type(module).__name__}: {why}", UserWarning, stacklevel=2)
            continue
        model.set_submodule(name, adder)
        originals[name] = module
        report.replaced.append((name, f"{type(module).__name__} -> {type(adder).__name__}"))
    if example is not None and originals:
        _verify(model, report, originals, example)
    converted = {n for n, _ in report.replaced}
    report.missing_norm = [n for n in adder_layers_without_norm(model) if n in converted]
    if report.missing_norm and missing_norm != "ignore":
        listed = ", ".join(report.missing_norm[:4]) + (", ..." if len(report.missing_norm) > 4 else "")
        msg = (
            f"adderize: {len(report.missing_norm)} adder layer(s) feed no normalisation layer ({listed}). Adder "
            "outputs are large and all negative (-sum|x - w|), so without BatchNorm/LayerNorm after them the "
            "network does not train (it stays at chance accuracy)"
        )
        if missing_norm == "error":
            raise ValueError(msg + "; add a norm after each, or call adderize(..., missing_norm='insert').")
        if missing_norm == "warn":
            warnings.warn(
                msg + "; pass missing_norm='insert' to add one, 'error' to stop, 'ignore' to silence.",
                UserWarning,
                stacklevel=2,
            )
        else:
            modules = dict(model.named_modules())
            for name in report.missing_norm:
                layer = modules[name]
                factory = {"device": layer.weight.device, "dtype": layer.weight.dtype}
                norm = (
                    nn.BatchNorm2d(layer.out_channels, **factory)
                    if isinstance(layer, Adder2d)
                    else nn.LayerNorm(layer.out_features, **factory)
                )
                model.set_submodule(name, nn.Sequential(layer, norm))
                report.inserted.append(name)
    return report


def _verify(model, report, originals, example):
    """Put back (report.reverted, one warning) the replaced layers that a forward pass of `example` does not call."""
    was_training = model.training
    model.train()
    try:
        called = _called(model, list(originals), example)
    finally:
        model.train(was_training)
    why = "the network does not call it (it reads its .weight), so an adder layer there would compute a dot product"
    for name in [n for n in originals if n not in called]:
        model.set_submodule(name, originals[name])
        report.reverted.append((name, why))
    report.replaced = [(n, what) for n, what in report.replaced if n in called]
    if report.reverted:
        names = [n for n, _ in report.reverted]
        listed = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
        warnings.warn(
            f"adderize: {len(names)} layer(s) stay multiplicative because the network does not call them as "
            f"modules ({listed}): it uses their .weight directly",
            UserWarning,
            stacklevel=3,
        )


def check_supported(model, what):
    """ConfigError naming the layer types of `model` that `what` ("quantisation", "ONNX export") does not handle
    yet: AdderLinear and L1-score AdderAttention (Adder2d is handled)."""
    found = {}
    for name, m in model.named_modules():
        if isinstance(m, AdderLinear) or isinstance(m, AdderAttention) and (m.scores == "l1" or m.value == "adder"):
            found.setdefault(type(m).__name__, []).append(name)
    if found:
        kinds = "; ".join(
            f"{kind} ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})" for kind, names in found.items()
        )
        raise ConfigError(
            f"{what} does not support {', '.join(found)} layers yet: {kinds}. It handles Adder2d layers "
            f"(the paper's models, model=torchvision); evaluate this model unquantised / in PyTorch."
        )
