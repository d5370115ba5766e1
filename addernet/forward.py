"""Where a batch meets the model: device placement, autocast and the cross-entropy.

The training tasks train with ``logits_and_loss`` and the engine validates with it, so both see the
same device placement, memory format, autocast and loss.
"""

import torch
import torch.nn.functional as F

from .config.schema import AMP

AMP_DTYPES = dict(zip(AMP, (None, torch.bfloat16, torch.float16)))  # trainer.amp -> the autocast dtype


def autocast(device, amp):
    """torch.autocast for ``amp`` in off|bf16|fp16 (disabled, not skipped, when off; trainer.amp is checked by the
    schema)."""
    device = torch.device(device)
    return torch.autocast(device.type, dtype=AMP_DTYPES[amp] or torch.float32, enabled=amp != "off")


def to_device(images, target, device, memory_format=torch.contiguous_format):
    """Move a batch to ``device`` without waiting for it (pinned memory makes the copy asynchronous)."""
    return (images.to(device, non_blocking=True, memory_format=memory_format), target.to(device, non_blocking=True))


def logits_and_loss(model, images, target, amp="off", reduction="mean", label_smoothing=0.0):
    """(float32 N x classes logits, cross-entropy) of ``model`` on a batch already on the device.

    ``label_smoothing``: cross-entropy's own argument (task.label_smoothing in training; validation uses 0).
    """
    with autocast(images.device, amp):
        logits = model(images)
    logits = logits.float().flatten(1)
    return logits, F.cross_entropy(logits, target, reduction=reduction, label_smoothing=float(label_smoothing))
