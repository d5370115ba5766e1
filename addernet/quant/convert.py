"""quantize_model(model, loader, cfg): post-training quantisation of every adder layer (docs/quantization.md).

1. activation ranges A from a float eval-mode pass over the calibration images (calibration.py);
2. per adder layer: group the filters by max |w| (grouping.py), s_g = min(A, max |W_g|), clamp the
   weights to [-A, A] with their bias term, quantise (quantizer.py), swap in a QAdder2d;
3. optionally re-estimate BatchNorm with the quantised model over the same images.
Everything else (stem convolution, classifier, BatchNorm, pooling) stays float, as in the code.
"""

import math

import torch

from ..errors import CheckpointError, ConfigError
from ..models.adderize import check_supported
from ..ops import Adder2d
from .calibration import activation_ranges, floored_layers, recalibrate_bn
from .grouping import METHODS, group_filters
from .qadder import KERNELS, QAdder2d
from .quantizer import clamp_weight, group_scales, quantize_weight


def check_quant_config(q):
    """Validate the quant.* keys quantize_model uses (ConfigError naming the key and the fix)."""
    bits = q.get("bits")
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 16:
        raise ConfigError(
            f"quant.bits={bits!r} is not supported: use an integer from 2 to 16 (e.g. quant.bits=8), "
            f"or quant.bits=null for the float model."
        )
    for key, low in (("groups", 1), ("calib_images", 1), ("calib_batch_size", 1)):
        v = q.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ConfigError(f"quant.{key}={v!r} must be an integer >= {low}.")
    if not 0 < float(q.get("act_quantile")) <= 1:
        raise ConfigError(f"quant.act_quantile={q.get('act_quantile')!r} must lie in (0, 1], e.g. 0.9994.")
    if q.get("grouping") not in METHODS:
        raise ConfigError(f"quant.grouping={q.get('grouping')!r}: choose one of {', '.join(METHODS)}.")
    if q.get("kernel") not in KERNELS:
        raise ConfigError(f"quant.kernel={q.get('kernel')!r}: choose one of {', '.join(KERNELS)}.")
    mom = q.get("bn_momentum")
    if mom is not None and not 0 < float(mom) <= 1:
        raise ConfigError(f"quant.bn_momentum={mom!r} must be null (exact average) or in (0, 1].")


def adder_layers(model):
    return [(name, m) for name, m in model.named_modules() if isinstance(m, Adder2d)]


def replace_module(model, name, new):
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, new)


@torch.no_grad()
def quantize_layer(adder, act_range, bits, n_groups, grouping="kmeans", seed=0, kernel="auto"):
    """QAdder2d for one float Adder2d with calibrated activation range `act_range`."""
    if adder.bias is not None:
        raise ConfigError(
            "adder layers with a bias are not supported by the quantiser (every body layer "
            "here is bias-free, followed by BatchNorm)"
        )
    w = adder.weight.detach().float()
    group = group_filters(w, n_groups, grouping, seed)
    scale = group_scales(w, group, n_groups, act_range)
    clamped, beta = clamp_weight(w, act_range)
    q = QAdder2d.like(adder, bits, n_groups, kernel).to(w.device)
    q.qweight.copy_(quantize_weight(clamped, scale[group], bits))
    q.group.copy_(group)
    q.scale.copy_(scale)
    q.bias_term.copy_(beta)
    q.act_range.fill_(float(act_range))
    return q


def quantize_model(model, loader, cfg, bn_loader=None, progress=True):
    """Quantise every Adder2d of `model` in place (returned) with the quant config `cfg`: activation ranges
    from `loader`, BatchNorm re-estimated (quant.bn_recalib) over `bn_loader` (default: `loader`);
    ``progress``: the calibration passes' tqdm bars."""
    check_quant_config(cfg)
    check_supported(model, "quantisation")
    layers = adder_layers(model)
    if not layers:
        raise ConfigError(
            f"{type(model).__name__} has no adder layers to quantise (model.layer=conv?); "
            f"drop quant.bits or evaluate an AdderNet."
        )
    for name, m in layers:
        if cfg.groups > m.out_channels:
            raise ConfigError(
                f"quant.groups={cfg.groups} is more than the {m.out_channels} filters of adder layer "
                f"{name}; use quant.groups <= {min(x.out_channels for _, x in layers)}."
            )
    try:
        ranges = activation_ranges(model, loader, float(cfg.act_quantile), float(cfg.act_range_floor), progress)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    for name, m in layers:
        replace_module(
            model,
            name,
            quantize_layer(m, ranges[name], int(cfg.bits), int(cfg.groups), cfg.grouping, int(cfg.seed), cfg.kernel),
        )
    if cfg.bn_recalib:
        momentum = None if cfg.bn_momentum is None else float(cfg.bn_momentum)
        recalibrate_bn(model, bn_loader or loader, momentum, progress=progress)
    return model


def prepare_quantized(model, state, kernel="auto", source="checkpoint"):
    """Swap in empty QAdder2d layers where `state` (a quantised state_dict) holds them, so it loads.

    Raises a one-line CheckpointError when the quantised layers do not match the model's adder layers.
    """
    names = sorted(k[: -len(".qweight")] for k in state if k.endswith(".qweight"))
    layers = dict(adder_layers(model))
    if sorted(layers) != names or any(
        tuple(state[f"{n}.qweight"].shape) != tuple(layers[n].weight.shape) for n in names
    ):
        raise CheckpointError(
            f"{source} is a quantised checkpoint of {len(names)} adder layers that do not match "
            f"the {len(layers)} adder layers of the model built ({type(model).__name__}); evaluate "
            f"it with the model it was quantised from (drop model= overrides)."
        )
    check_quantized_state(state, names, source)
    for n in names:
        replace_module(model, n, QAdder2d.like(layers[n], int(state[f"{n}.bits"]), state[f"{n}.scale"].numel(), kernel))
    return model


def _field_error(source, key, problem):
    return CheckpointError(
        f"{source}: {key} {problem}; the quantised file is damaged or was edited, so it is not evaluated "
        "(write it again with scripts/quantize.py)"
    )


def check_quantized_state(state, names, source="checkpoint"):
    """CheckpointError naming the first field of the quantised layers `names` (and of the BatchNorms) of `state`
    that a file written by quantize_model cannot hold: types, ranges, and agreement between the layers."""

    def tensor(key, kinds, ndim):
        t = state.get(key)
        if not isinstance(t, torch.Tensor) or t.dim() != ndim or t.dtype not in kinds:
            what = f"a {t.dim()}-D {t.dtype} tensor" if isinstance(t, torch.Tensor) else type(t).__name__
            raise _field_error(source, key, f"is {what}, not a {ndim}-D tensor of {kinds[0]}")
        return t

    ints, floats = (torch.int64, torch.int32, torch.int16, torch.int8), (torch.float32, torch.float64)
    first = None
    for n in names:
        bits = int(tensor(f"{n}.bits", ints, 0))
        if not 2 <= bits <= 16:
            raise _field_error(source, f"{n}.bits", f"is {bits}, outside 2..16")
        qweight = tensor(f"{n}.qweight", (torch.int8 if bits <= 8 else torch.int16,), 4)
        scale, group = tensor(f"{n}.scale", floats, 1), tensor(f"{n}.group", ints, 1)
        act_range, bias = float(tensor(f"{n}.act_range", floats, 0)), tensor(f"{n}.bias_term", floats, 1)
        if first is None:
            first = (n, bits, scale.numel())
        elif bits != first[1]:
            raise _field_error(source, f"{n}.bits", f"is {bits}, but layer {first[0]} has {first[1]} (one for all)")
        elif scale.numel() != first[2]:
            raise _field_error(
                source, f"{n}.scale", f"has {scale.numel()} groups, but layer {first[0]} has {first[2]} (one for all)"
            )
        half = 2 ** (bits - 1)
        if qweight.numel() and not (-half <= int(qweight.min()) and int(qweight.max()) <= half - 1):
            raise _field_error(
                source, f"{n}.qweight", f"holds values outside the {bits}-bit range [-{half}, {half - 1}]"
            )
        if not (math.isfinite(act_range) and act_range > 0):
            raise _field_error(source, f"{n}.act_range", f"is {act_range:g}, not a finite number > 0")
        if scale.numel() == 0 or not (torch.isfinite(scale).all() and (scale > 0).all()):
            raise _field_error(source, f"{n}.scale", "holds a value that is not a finite number > 0")
        if (scale > act_range * (1 + 1e-6)).any():
            raise _field_error(source, f"{n}.scale", f"holds {float(scale.max()):g}, above act_range {act_range:g}")
        out = qweight.shape[0]
        if group.shape != (out,) or group.numel() and not (0 <= int(group.min()) and int(group.max()) < scale.numel()):
            raise _field_error(source, f"{n}.group", f"must be {out} group indices in 0..{scale.numel() - 1}")
        if bias.shape != (out,) or not (torch.isfinite(bias).all() and (bias <= 0).all()):
            raise _field_error(source, f"{n}.bias_term", f"must be {out} finite numbers <= 0")
    for key, value in state.items():
        if isinstance(key, str) and key.endswith(".running_var") and isinstance(value, torch.Tensor):
            if value.is_floating_point() and (value < 0).any():
                raise _field_error(source, key, "holds a negative value (a variance is >= 0)")


def quant_summary(model, floor=1e-3):
    """{"bits", "groups", "layers", "floored_layers"} of a quantised model, or None when it has no QAdder2d;
    floored_layers: the layers whose activation range is the calibration floor `floor` (calibration.py)."""
    qs = {n: m for n, m in model.named_modules() if isinstance(m, QAdder2d)}
    if not qs:
        return None
    first = next(iter(qs.values()))
    floored = floored_layers({n: m.act_range for n, m in qs.items()}, floor)
    return {"bits": int(first.bits), "groups": int(first.scale.numel()), "layers": len(qs), "floored_layers": floored}
