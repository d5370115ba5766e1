"""The step helpers shared by training and evaluation, and evaluation over a (sharded) loader.

``to_device`` and ``logits_and_loss`` are the one place where a batch meets the model: the
classification task trains with them and ``evaluate`` validates with them, so both see the same
device placement, memory format, autocast and loss.
"""
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import distributed as dist
from .meters import MetricSums

AMP_DTYPES = {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(device, amp):
    """torch.autocast for ``amp`` in off|bf16|fp16 (disabled, not skipped, when off)."""
    if amp not in AMP_DTYPES:
        raise ValueError(f"amp must be one of {', '.join(AMP_DTYPES)}, got {amp!r} (trainer.amp).")
    device = torch.device(device)
    return torch.autocast(device.type, dtype=AMP_DTYPES[amp] or torch.float32, enabled=amp != "off")


def to_device(images, target, device, memory_format=torch.contiguous_format):
    """Move a batch to ``device`` without waiting for it (pinned memory makes the copy asynchronous)."""
    return (images.to(device, non_blocking=True, memory_format=memory_format),
            target.to(device, non_blocking=True))


def logits_and_loss(model, images, target, amp="off", reduction="mean", label_smoothing=0.0):
    """(float32 N x classes logits, cross-entropy) of ``model`` on a batch already on the device.

    ``label_smoothing``: cross-entropy's own argument (task.label_smoothing in training; validation uses 0).
    """
    with autocast(images.device, amp):
        logits = model(images)
    logits = logits.float().flatten(1)
    return logits, F.cross_entropy(logits, target, reduction=reduction, label_smoothing=float(label_smoothing))


@torch.no_grad()
def evaluate(model, loader, device, amp="off", channels_last=False):
    """Evaluate ``model`` on ``loader``; returns {"top1", "top5", "loss", "n", "images_per_s"}.

    Accuracies are in percent, loss is the mean cross-entropy. Under torchrun every rank passes its
    own shard (e.g. build_loader(..., "val", rank=, world_size=), which gives rank r the samples
    r, r+world, ... without padding); the sums are all-reduced, so ``n`` counts each sample exactly
    once and every rank gets the same numbers. Pass the bare model or a DDP wrapper (it is unwrapped,
    so ranks with different numbers of batches never wait on each other). images_per_s is the
    global throughput (all ranks' samples / the slowest rank's wall time).
    """
    if isinstance(model, nn.parallel.DistributedDataParallel):
        model = model.module
    was_training = model.training
    model.eval()
    sums = MetricSums(device)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    start = time.perf_counter()
    for images, target in loader:
        images, target = to_device(images, target, device, memory_format)
        logits, loss_sum = logits_and_loss(model, images, target, amp, reduction="sum")
        sums.update(loss_sum, logits, target)
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    seconds = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
    if dist.is_distributed():
        torch.distributed.all_reduce(seconds, op=torch.distributed.ReduceOp.MAX)
    model.train(was_training)
    out = sums.all_reduce().compute()
    out["images_per_s"] = out["n"] / max(seconds.item(), 1e-9)
    return out
