"""Evaluation over a (possibly sharded) validation loader with exact cross-rank counts."""
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
    start = time.perf_counter()
    for images, target in loader:
        images = images.to(device, non_blocking=True)
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        target = target.to(device, non_blocking=True)
        with autocast(device, amp):
            logits = model(images)
        logits = logits.float().flatten(1)
        sums.update(F.cross_entropy(logits, target, reduction="sum"), logits, target)
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    seconds = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
    if dist.is_distributed():
        torch.distributed.all_reduce(seconds, op=torch.distributed.ReduceOp.MAX)
    model.train(was_training)
    out = sums.all_reduce().compute()
    out["images_per_s"] = out["n"] / max(seconds.item(), 1e-9)
    return out
