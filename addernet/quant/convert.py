"""quantize_model(model, loader, cfg): post-training quantisation of every adder layer (docs/quantization.md).

1. activation ranges A from a float eval-mode pass over the calibration images (calibration.py);
2. per adder layer: group the filters by max |w| (grouping.py), s_g = min(A, max |W_g|), clamp the
   weights to [-A, A] with their bias term, quantise (quantizer.py), swap in a QAdder2d;
3. optionally re-estimate BatchNorm with the quantised model over the same images.
Everything else (stem convolution, classifier, BatchNorm, pooling) stays float, as in the code.
"""

import logging
import math
import time

import torch
from tqdm import tqdm

from ..checks import choice, number
from ..errors import CheckpointError, ConfigError
from ..models import AdderAttention
from ..ops import Adder2d, AdderLinear
from .calibration import Replay, activation_ranges, floored_layers, recalibrate_bn, shift_bn
from .grouping import METHODS, group_filters
from .qadder import KERNELS, QAdder2d
from .quantizer import GRIDS, clamp_weight, grid_step, group_scales, quantize_weight, weight_dtype

log = logging.getLogger("addernet.quant")


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


RUNTIMES = ("auto", "integer", "layers")
BN_METHODS = ("reestimate", "shift", "shift_scale")
ACT_RANGES = ("quantile", "output", "mse")


def check_quant_settings(q):
    """Range-check every quant.* setting that is given (quant.bits may be null: the float model): a one-line
    ConfigError naming the key, its value and what it takes. Run before any work (test.py, quantize.py,
    export_onnx.py check it before reading the checkpoint)."""
    bits = q.get("bits")
    if bits is not None and (isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 16):
        raise ConfigError(
            f"quant.bits={bits!r} is not supported: use an integer from 2 to 16 (e.g. quant.bits=8), "
            f"or quant.bits=null for the float model."
        )
    for key, low in (("groups", 1), ("calib_images", 1), ("calib_batch_size", 1), ("seed", 0)):
        number(q, key, f"quant.{key}", minimum=low, integer=True)
    quantile = q.get("act_quantile")
    if isinstance(quantile, bool) or not isinstance(quantile, (int, float)) or not 0 < quantile <= 1:
        raise ConfigError(f"quant.act_quantile={quantile!r} must be a number in (0, 1], e.g. 0.9994.")
    number(q, "act_range_floor", "quant.act_range_floor", positive=True)
    mom = q.get("bn_momentum")
    if mom is not None and (isinstance(mom, bool) or not isinstance(mom, (int, float)) or not 0 < mom <= 1):
        raise ConfigError(f"quant.bn_momentum={mom!r} must be null (exact average) or a number in (0, 1].")
    choice(q, "grouping", "quant.grouping", METHODS)
    choice(q, "kernel", "quant.kernel", KERNELS)
    choice(q, "runtime", "quant.runtime", RUNTIMES)
    choice(q, "weight_grid", "quant.weight_grid", GRIDS)
    choice(q, "bn_method", "quant.bn_method", BN_METHODS)
    choice(q, "act_range", "quant.act_range", ACT_RANGES)


def check_quant_config(q):
    """Validate the quant.* keys quantize_model uses, quant.bits required (ConfigError naming the key and the fix)."""
    if q.get("bits") is None:
        raise ConfigError("quantisation needs a bit width: quant.bits=8 (an integer from 2 to 16).")
    check_quant_settings(q)


def adder_layers(model):
    return [(name, m) for name, m in model.named_modules() if isinstance(m, Adder2d)]


def replace_module(model, name, new):
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, new)


@torch.no_grad()
def quantize_layer(adder, act_range, bits, n_groups, grouping="kmeans", seed=0, kernel="auto", grid="signed"):
    """QAdder2d for one float Adder2d with calibrated activation range `act_range`."""
    if adder.bias is not None:
        raise ConfigError(
            "adder layers with a bias are not supported by the quantiser (every body layer "
            "here is bias-free, followed by BatchNorm)"
        )
    w = adder.weight.detach().float()
    group = group_filters(w, n_groups, grouping, seed)
    scale = group_scales(w, group, n_groups, act_range)
    clamped, beta = clamp_weight(w, act_range, grid)
    q = QAdder2d.like(adder, bits, n_groups, kernel, grid).to(w.device)
    q.qweight.copy_(quantize_weight(clamped, scale[group], bits, grid))
    q.group.copy_(group)
    q.scale.copy_(scale)
    q.bias_term.copy_(beta)
    q.act_range.fill_(float(act_range))
    return q


# act_range=output: the candidate ranges, each the max over batches of a per-batch quantile of |x|
OUTPUT_QUANTILES = (0.999, 0.9994, 0.9997, 0.9999, 0.99997, 1.0)


@torch.no_grad()
def output_range(adder, candidates, x, settings):
    """The range among ``candidates`` whose quantised layer (``settings``: quantize_layer's bits, groups, grouping,
    seed, kernel, grid) is closest to the float layer ``adder`` on its calibration input ``x``: the least mean,
    over the output channels, of the variance of the error (its per-channel mean is what the BatchNorm correction
    removes). Ours: the layer-wise output criterion of post-training quantisation (e.g. Nagel et al. 2021)."""
    y = adder(x)
    scores = []
    for a in candidates:
        e = (quantize_layer(adder, a, *settings)(x) - y).double()
        scores.append(float(e.transpose(0, 1).flatten(1).var(1, unbiased=False).mean()))
    return candidates[min(range(len(candidates)), key=scores.__getitem__)]


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
    how = {True: "augmented training images", False: "training images, validation transform"}
    shift = bool(cfg.bn_recalib) and cfg.bn_method in ("shift", "shift_scale")
    float_moments = [] if shift else None
    first = {} if cfg.act_range == "output" else None
    loader = Replay(loader) if shift else loader  # read twice: the ranges, then the BatchNorm shift
    try:
        ranges = activation_ranges(
            model,
            loader,
            OUTPUT_QUANTILES if cfg.act_range == "output" else float(cfg.act_quantile),
            float(cfg.act_range_floor),
            progress,
            on=f" on {how[bool(cfg.calib_augment)]}",
            bn_moments=float_moments,
            mse_bits=int(cfg.bits) if cfg.act_range == "mse" else None,
            inputs=first,
        )
    except ValueError as e:
        raise ConfigError(str(e)) from None
    settings = (int(cfg.bits), int(cfg.groups), cfg.grouping, int(cfg.seed), cfg.kernel, cfg.weight_grid)
    if first is not None:
        start, images = time.perf_counter(), len(next(iter(first.values())))
        log.info(
            "calibration: activation range of %d adder layer(s), the best of %d candidates each on %d image(s) ...",
            len(layers),
            len(OUTPUT_QUANTILES),
            images,
        )
        chosen = tqdm(layers, desc="activation ranges", unit="layer", disable=not progress, leave=False)
        ranges = {name: output_range(m, ranges[name], first[name], settings) for name, m in chosen}
        log.info("calibration: activation ranges chosen in %.1f s", time.perf_counter() - start)
    for name, m in layers:
        replace_module(model, name, quantize_layer(m, ranges[name], *settings))
    if shift:
        on = f" on the same {how[bool(cfg.calib_augment)]}"
        shift_bn(model, loader, float_moments, cfg.bn_method == "shift_scale", progress, on)
    elif cfg.bn_recalib:
        momentum = None if cfg.bn_momentum is None else float(cfg.bn_momentum)
        on = f" on {how[bool(cfg.bn_augment)] if bn_loader is not None else 'the same images'}"
        recalibrate_bn(model, bn_loader or loader, momentum, progress=progress, announce=True, on=on)
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
    for n in names:  # files written before the unsigned grid existed: AdderQuant's signed grid
        state.setdefault(f"{n}.weight_step", torch.tensor(grid_step("signed")))
    check_quantized_state(state, names, source)
    for n in names:
        grid = "unsigned" if int(state[f"{n}.weight_step"]) == 1 else "signed"
        q = QAdder2d.like(layers[n], int(state[f"{n}.bits"]), state[f"{n}.scale"].numel(), kernel, grid)
        replace_module(model, n, q)
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
        step = int(tensor(f"{n}.weight_step", ints, 0))
        if step not in (1, 2):
            raise _field_error(source, f"{n}.weight_step", f"is {step}, not 1 (unsigned grid) or 2 (signed grid)")
        grid = "unsigned" if step == 1 else "signed"
        qweight = tensor(f"{n}.qweight", (weight_dtype(bits, grid),), 4)
        scale, group = tensor(f"{n}.scale", floats, 1), tensor(f"{n}.group", ints, 1)
        act_range, bias = float(tensor(f"{n}.act_range", floats, 0)), tensor(f"{n}.bias_term", floats, 1)
        if first is None:
            first = (n, bits, scale.numel(), step)
        elif bits != first[1]:
            raise _field_error(source, f"{n}.bits", f"is {bits}, but layer {first[0]} has {first[1]} (one for all)")
        elif step != first[3]:
            raise _field_error(
                source, f"{n}.weight_step", f"is {step}, but layer {first[0]} has {first[3]} (one for all)"
            )
        elif scale.numel() != first[2]:
            raise _field_error(
                source, f"{n}.scale", f"has {scale.numel()} groups, but layer {first[0]} has {first[2]} (one for all)"
            )
        low, high = (0, 2**bits - 1) if grid == "unsigned" else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        if qweight.numel() and not (low <= int(qweight.min()) and int(qweight.max()) <= high):
            raise _field_error(source, f"{n}.qweight", f"holds values outside the {bits}-bit range [{low}, {high}]")
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
    """{"bits", "groups", "weight_grid", "layers", "floored_layers"} of a quantised model, or None when it has
    no QAdder2d; floored_layers: the layers whose activation range is the calibration floor `floor` (calibration.py)."""
    qs = {n: m for n, m in model.named_modules() if isinstance(m, QAdder2d)}
    if not qs:
        return None
    first = next(iter(qs.values()))
    floored = floored_layers({n: m.act_range for n, m in qs.items()}, floor)
    return {
        "bits": int(first.bits),
        "groups": int(first.scale.numel()),
        "weight_grid": first.grid,
        "layers": len(qs),
        "floored_layers": floored,
    }
