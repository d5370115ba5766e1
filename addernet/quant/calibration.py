"""Calibration passes over training images (docs/quantization.md): activation ranges, then BatchNorm statistics.

Activation range A of an adder layer: per batch, the `quantile` of |x| over the
whole input tensor of the layer (the k-th smallest |x|, k = ceil(quantile * numel)); A is the running
max of these over the batches, floored at `floor`. The code's alpha = 0.9997 is applied twice, so its
effective quantile is 0.9997^2 = 0.99940, our default. A layer whose inputs never exceed the floor (all zero:
a dead layer, or calibration images unlike the training data) gets the floor, with a warning naming it:
its activation grid then says nothing about the data (floored_layers).
"""

import logging
import math
import warnings

import torch
import torch.nn as nn
from tqdm import tqdm

from ..data import iter_from
from ..ops import Adder2d

log = logging.getLogger("addernet.quant")


class NegativeInput(ValueError):
    """An adder layer saw negative inputs: the unsigned activation quantiser does not apply to it."""


def _batches(loader, desc, total, progress):
    """``loader``'s batches (its workers shut down at the end, an error included) under a tqdm bar of ``total``
    (default: the loader's length, where it has one)."""
    total = len(loader) if total is None and hasattr(loader, "__len__") else total
    return tqdm(iter_from(loader), desc=desc, total=total, unit="batch", disable=not progress, leave=False)


@torch.no_grad()
def activation_ranges(model, loader, quantile, floor=1e-3, progress=True):
    """{adder layer name: A} from an eval-mode float forward pass over `loader` (BN running statistics);
    a tqdm bar (``progress``) counts the batches."""
    ranges, negative, hooks = {}, [], []

    def hook(name):
        def observe(module, args):
            a = args[0].detach().abs().flatten()
            k = min(a.numel(), max(1, math.ceil(quantile * a.numel())))
            value = a.kthvalue(k).values.item() if k < a.numel() else a.max().item()
            ranges[name] = max(ranges.get(name, floor), value)
            if name not in negative and bool((args[0] < 0).any()):
                negative.append(name)

        return observe

    for name, m in model.named_modules():
        if isinstance(m, Adder2d):
            hooks.append(m.register_forward_pre_hook(hook(name)))
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    seen = 0
    try:
        for images, *_ in _batches(loader, "calibration", None, progress):
            model(images.to(device))
            seen += images.shape[0]
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    log.info("calibration: activation ranges of %d adder layer(s) from %d image(s)", len(hooks), seen)
    floored = floored_layers(ranges, floor)
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


def floored_layers(ranges, floor):
    """The layers of `ranges` ({name: A}, floats or tensors) whose activation range is the floor."""
    return [name for name, a in ranges.items() if float(a) <= float(torch.tensor(floor, dtype=torch.float32))]


@torch.no_grad()
def recalibrate_bn(model, loader, momentum=None, total=None, desc="BN re-estimation", progress=True):
    """Re-estimate every BatchNorm's running statistics with the (quantised) model (the code's `adjust_BN`).

    momentum=None (ours, default): reset and take the exact average over the calibration batches;
    a number: PyTorch-convention update from the current statistics (0.1 = MindSpore's 0.9, the code's).
    Only BatchNorm layers run in training mode; nothing else changes. ``loader``: any iterable of
    (images, ...) or of image tensors; a tqdm bar (``progress``) counts its batches (``total``: their number).
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
    seen = 0
    try:
        for batch in _batches(loader, desc, total, progress):
            images = batch if torch.is_tensor(batch) else batch[0]
            model(images.to(device))
            seen += images.shape[0]
    finally:
        for m, mom in zip(bns, saved):
            m.momentum = mom
        model.train(was_training)
    log.info("%s: %d BatchNorm layer(s) re-estimated on %d image(s)", desc, len(bns), seen)
    return model
