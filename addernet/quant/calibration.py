"""Calibration passes over training images (docs/quantization.md): activation ranges, then BatchNorm statistics.

Activation range A of an adder layer: per batch, the `quantile` of |x| over the
whole input tensor of the layer (the k-th smallest |x|, k = ceil(quantile * numel)); A is the running
max of these over the batches, floored at `floor`. The code's alpha = 0.9997 is applied twice, so its
effective quantile is 0.9997^2 = 0.99940, our default. A layer whose inputs never exceed the floor (all zero:
a dead layer, or calibration images unlike the training data) gets the floor, with a warning naming it:
its activation grid then says nothing about the data (floored_layers).
"""

import contextlib
import logging
import math
import time
import warnings

import torch
import torch.nn as nn
from tqdm import tqdm

from ..data import iter_from
from ..ops import Adder2d
from .quantizer import levels

log = logging.getLogger("addernet.quant")


class NegativeInput(ValueError):
    """An adder layer saw negative inputs: the unsigned activation quantiser does not apply to it."""


@contextlib.contextmanager
def stage(desc, loader, what, on="", total=None, progress=True, announce=True):
    """One pass over ``loader``: logs its start (``what`` it computes, ``on`` which images, how many images and
    batches; when ``announce``), yields the batches under a tqdm bar (``progress``; closed on an error too, so
    an error message never shares its line) and logs the images seen and the seconds it took at the end.
    The workers of a DataLoader are shut down at the end, an error included."""
    total = len(loader) if total is None and hasattr(loader, "__len__") else total
    if announce:
        images = len(loader.dataset) if hasattr(loader, "dataset") else None
        count = f"{images} image(s) in {total} batch(es)" if images is not None else f"{total} batch(es)"
        log.info("%s: %s%s: %s ...", desc, what, on, count)
    seen, start = [0], time.perf_counter()
    with tqdm(iter_from(loader), desc=desc, total=total, unit="batch", disable=not progress, leave=False) as bar:

        def batches():
            for batch in bar:
                images = batch if torch.is_tensor(batch) else batch[0]
                seen[0] += images.shape[0]
                yield images

        yield batches()
    log.info("%s: %s done, %d image(s) in %.1f s", desc, what, seen[0], time.perf_counter() - start)


class Replay:
    """``loader``'s batches: read from the loader the first time, replayed from memory afterwards (a second
    calibration pass over the same images need not decode them again), as long as they fit in ``budget``
    bytes; beyond it they are read again each time. The loader's order and per-image augmentation are fixed
    (cli.calibration_loader), so a replayed pass sees exactly what a second reading would."""

    def __init__(self, loader, budget=1 << 29):
        self.loader, self.budget, self.kept = loader, budget, None
        self.dataset = getattr(loader, "dataset", None)

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        if self.kept is not None:
            yield from self.kept
            return
        kept, size = [], 0
        for batch in iter_from(self.loader):
            if kept is not None:
                size += sum(t.numel() * t.element_size() for t in batch if torch.is_tensor(t))
                if size <= self.budget:
                    kept.append(batch)
                else:
                    kept = None
            yield batch
        self.kept = kept


@torch.no_grad()
def activation_ranges(
    model, loader, quantile, floor=1e-3, progress=True, on="", bn_moments=None, mse_bits=None, inputs=None
):
    """{adder layer name: A} from an eval-mode float forward pass over `loader` (BN running statistics);
    a tqdm bar (``progress``) counts the batches; ``on``: said of the images in the stage's start line.
    ``quantile``: a number, or a tuple of them for a tuple of ranges per layer (one pass for all).
    ``bn_moments``: a list that gets, per batch, {BatchNorm name: channel (mean, variance) of its input} (shift_bn).
    ``mse_bits``: None for the quantile range (the module docstring); b for the range of least squared
    quantisation error at b bits (mse_range) over a strided sample of every batch's inputs.
    ``inputs``: a dict that gets {adder layer name: its input in the first batch}."""
    ranges, negative, hooks, samples = {}, [], [], {}
    qs = quantile if isinstance(quantile, tuple) else (quantile,)

    def hook(name):
        def observe(module, args):
            a = args[0].detach().abs().flatten()
            if inputs is not None and name not in inputs:
                inputs[name] = args[0].detach().clone()
            if mse_bits is not None:
                samples.setdefault(name, []).append(a[:: max(1, a.numel() // SAMPLE_PER_BATCH)].float().cpu())
            else:
                ks = [min(a.numel(), max(1, math.ceil(q * a.numel()))) for q in qs]
                top = largest(a, a.numel() - min(ks) + 1)  # the k-th smallest |x| is the (n - k + 1)-th largest
                old = ranges.get(name, (floor,) * len(qs))
                ranges[name] = tuple(max(o, top[a.numel() - k].item()) for o, k in zip(old, ks))
            if name not in negative and bool((args[0] < 0).any()):
                negative.append(name)

        return observe

    def record(name):
        def observe(module, args):
            bn_moments[-1][name] = channel_moments(args[0])

        return observe

    for name, m in model.named_modules():
        if isinstance(m, Adder2d):
            hooks.append(m.register_forward_pre_hook(hook(name)))
        elif bn_moments is not None and isinstance(m, nn.modules.batchnorm._BatchNorm):
            hooks.append(m.register_forward_pre_hook(record(name)))
    adders = sum(isinstance(m, Adder2d) for m in model.modules())
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        what = f"activation ranges of {adders} adder layer(s)" + (
            " and BatchNorm input moments" if bn_moments is not None else ""
        )
        with stage("calibration", loader, what, on, None, progress) as b:
            for images in b:
                if bn_moments is not None:
                    bn_moments.append({})
                model(images.to(device))
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    for name, parts in samples.items():
        ranges[name] = max(floor, mse_range(torch.cat(parts), mse_bits))
    if not isinstance(quantile, tuple) and mse_bits is None:
        ranges = {name: r[0] for name, r in ranges.items()}
    floored = floored_layers({n: max(r) if isinstance(r, tuple) else r for n, r in ranges.items()}, floor)
    if floored:
        listed = ", ".join(floored[:4]) + (", ..." if len(floored) > 4 else "")
        warnings.warn(
            f"calibration: {len(floored)} of {len(ranges)} adder layer(s) saw no input above the activation range "
            f"floor {floor:g} ({listed}), so their range is the floor; their inputs were all (near) zero on the "
            "calibration images: check that the images are the model's data (and quant.calib_images)",
            RuntimeWarning,
            stacklevel=2,
        )
    if negative:
        raise NegativeInput(
            f"adder layer(s) {', '.join(negative)} receive negative inputs; the quantiser here "
            f"is unsigned (inputs after a ReLU), a signed quantiser is not implemented"
        )
    return ranges


SAMPLE_PER_BATCH = 16384  # inputs of a layer per batch kept for mse_range (every k-th element)
MSE_CANDIDATES = 128


def mse_range(x, bits, candidates=MSE_CANDIDATES):
    """The range A in {max(x) i / candidates : i = 1..candidates} that minimises the mean of (x - Q_A(x))^2 over
    the non-negative values ``x``, Q_A the b-bit unsigned quantiser of [0, A] (rounding and clipping error
    together; ours, the mean-squared-error clipping of e.g. Banner et al. 2019 and Sung et al. 2015); 0 for an
    all-zero x."""
    x = x.double()
    top, lv = float(x.max()), levels(bits)
    if top <= 0:
        return 0.0
    grid = torch.arange(1, candidates + 1, dtype=torch.float64) * (top / candidates)
    errors = torch.stack([((x * (lv / a)).round().clamp(0, lv) * (a / lv) - x).square().mean() for a in grid])
    return float(grid[int(errors.argmin())])


def floored_layers(ranges, floor):
    """The layers of `ranges` ({name: A}, floats or tensors) whose activation range is the floor."""
    return [name for name, a in ranges.items() if float(a) <= float(torch.tensor(floor, dtype=torch.float32))]


@torch.no_grad()
def recalibrate_bn(
    model, loader, momentum=None, total=None, desc="BN re-estimation", progress=True, announce=False, on=""
):
    """Re-estimate every BatchNorm's running statistics with the (quantised) model (the code's `adjust_BN`).

    momentum=None (ours, default): reset and take the exact average over the calibration batches;
    a number: PyTorch-convention update from the current statistics (0.1 = MindSpore's 0.9, the code's).
    Only BatchNorm layers run in training mode; nothing else changes. ``loader``: any iterable of
    (images, ...) or of image tensors; a tqdm bar (``progress``) counts its batches (``total``: their number);
    ``announce``: a log line when it starts (stage()), ``on``: said of the images in it.
    """
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    saved = [m.momentum for m in bns]
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    for m in bns:
        if momentum is None:
            m.reset_running_stats()
        m.momentum = momentum
        m.train()
    try:
        with stage(desc, loader, f"{len(bns)} BatchNorm layer(s)", on, total, progress, announce) as b:
            for images in b:
                model(images.to(device))
    finally:
        for m, mom in zip(bns, saved):
            m.momentum = mom
        model.train(was_training)
    return model


def channel_moments(x):
    """(mean, variance) of every channel of a (N, C, ...) tensor (the variance over N x H x W, biased), in float64.

    The shifted-data algorithm: one value of each channel is subtracted first, so the sums are of deviations of
    the size of the spread, not of the values (adder outputs of ~1e4 with a spread of ~1e2 keep their digits);
    the sums run along contiguous rows in the tensor's precision and are added up in float64."""
    n, c = x.shape[:2]
    y = x.detach().reshape(n, c, -1)
    ref = y[:1, :, :1].clone()
    z = y - ref
    count = n * y.shape[-1]
    mean = z.sum(-1).double().sum(0) / count
    var = torch.linalg.vector_norm(z, dim=-1).double().square().sum(0) / count - mean * mean
    return mean + ref.flatten().double(), var.clamp(min=0)


def largest(a, count):
    """The ``count`` largest values of the 1-D tensor ``a``, in descending order (torch.topk), exactly; the values
    below a threshold taken from a strided sample are left out first (the rare tail of a layer's inputs is
    all that is sorted), unless fewer than ``count`` lie above it."""
    if count * 64 < a.numel():
        sample = a[:: max(1, a.numel() // 65536)]
        t = sample.topk(min(sample.numel(), math.ceil(4 * count * sample.numel() / a.numel()) + 1)).values[-1]
        above = a[a >= t]
        if above.numel() >= count:
            return above.topk(count).values
    return a.topk(count).values


@torch.no_grad()
def shift_bn(model, loader, float_moments, scale=False, progress=True, on=""):
    """Correct every BatchNorm's running statistics by the change quantisation causes in its input (ours, bias
    correction in the manner of Nagel et al. 2019), measured on the same calibration images in both models:
    running_mean += E[x_quant] - E[x_float], and with ``scale`` also running_var *= Var[x_quant] / Var[x_float]
    (channel by channel). The float model's statistics stay the anchor: only what quantisation changed moves.

    ``float_moments``: per batch of ``loader`` (the same images, in the same order), {BatchNorm name: the float
    model's channel (mean, variance) of its input} (activation_ranges(bn_moments=...)). During the pass each
    BatchNorm already uses the batch's own correction, so every layer is corrected for those before it; the
    final shift is the image-weighted mean of the batches' shifts, the final ratio that of the pooled variances.
    """
    bns = {n: m for n, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)}
    mean0 = {n: m.running_mean.clone() for n, m in bns.items()}
    var0 = {n: m.running_var.clone() for n, m in bns.items()}
    sums = {n: [torch.zeros_like(b, dtype=torch.float64) for _ in range(3)] for n, b in mean0.items()}
    batch, seen, hooks = [0], [0], []

    def hook(name):
        def correct(module, args):
            (mq, vq), (mf, vf), n = channel_moments(args[0]), float_moments[batch[0]][name], args[0].shape[0]
            d, (shift, var_q, var_f) = mq - mf, sums[name]
            shift += d * n
            module.running_mean.copy_(mean0[name] + d.to(mean0[name].dtype))
            if scale:
                var_q += vq * n
                var_f += vf * n
                module.running_var.copy_(var0[name] * _ratio(vq, vf).to(var0[name].dtype))

        return correct

    for name, m in bns.items():
        hooks.append(m.register_forward_pre_hook(hook(name)))
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    desc = "BN mean and variance shift" if scale else "BN mean shift"
    try:
        with stage(desc, loader, f"{len(bns)} BatchNorm layer(s)", on, len(float_moments), progress) as b:
            for images in b:
                if batch[0] >= len(float_moments):
                    raise ValueError("shift_bn: the loader has more batches than float_moments")
                model(images.to(device))
                seen[0] += images.shape[0]
                batch[0] += 1
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
        for name, m in bns.items():
            shift, var_q, var_f = sums[name]
            m.running_mean.copy_(mean0[name] + (shift / max(seen[0], 1)).to(mean0[name].dtype))
            if scale:
                m.running_var.copy_(var0[name] * _ratio(var_q, var_f).to(var0[name].dtype))
    return model


def _ratio(num, den):
    """num / den channel by channel, 1 where den is 0 (a channel constant on the calibration images)."""
    return torch.where(den > 0, num / den.clamp(min=torch.finfo(torch.float64).tiny), torch.ones_like(num))
