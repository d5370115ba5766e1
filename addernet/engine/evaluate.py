"""Evaluation over a (sharded) loader, with the same forward as training (addernet.forward)."""

import time

import torch
import torch.nn as nn

from .. import distributed as dist
from ..data import iter_from
from ..forward import logits_and_loss, to_device
from .meters import MetricSums


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
    for images, target in iter_from(loader):
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
