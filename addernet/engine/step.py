"""One optimizer step: batch mixing (data.mixup_alpha / cutmix_alpha), the batch's micro-batches
(trainer.accumulate), backward, gradient clipping (trainer.clip_grad_norm), the optimizer step with the
adaptive LR's pre-step hook, then the weight average.

Accumulation splits the loaded batch (the process's share of data.batch_size) into N micro-batches, so the
recipe's batch, the steps per epoch, the schedule and the checkpoint/SIGTERM positions (which are step
boundaries) do not change with N: only the activation memory does. Each micro-batch's mean loss is
weighted by its share of the batch, so the accumulated gradient is the gradient of the whole batch's mean
loss; the adaptive LR then sees that total. Under DDP the non-final micro-batches run inside ``no_sync``.
"""

import contextlib

import torch

from ..data.mix import hard_labels


def micro_batches(images, target, accumulate):
    """The batch split into up to ``accumulate`` near-equal micro-batches of at least 2 samples (BatchNorm)."""
    chunks = max(1, min(int(accumulate), target.shape[0] // 2))
    return list(zip(images.tensor_split(chunks), target.tensor_split(chunks)))


def clip_parameters(optimizer, adaptive):
    """What trainer.clip_grad_norm covers: every optimised parameter except the adder weights that the
    adaptive LR normalises (their gradient norm is set to eta * sqrt(k) right after the clip anyway)."""
    skip = {id(p) for p in adaptive.weights} if adaptive is not None else set()
    return [p for group in optimizer.param_groups for p in group["params"] if id(p) not in skip]


class Stepper:
    """``stepper(images, target, sums, watch, step)`` makes one optimizer step from one loaded batch."""

    def __init__(self, task, optimizer, scaler, adaptive=None, accumulate=1, clip_grad_norm=None, ema=None, mix=None):
        self.task, self.optimizer, self.scaler, self.ema, self.mix = task, optimizer, scaler, ema, mix
        self.accumulate = int(accumulate)
        self.clip = float(clip_grad_norm) if clip_grad_norm is not None else None
        self.clip_params = clip_parameters(optimizer, adaptive) if self.clip is not None else []

    def __call__(self, images, target, sums, watch, step):
        if self.mix is not None:  # MixUp / CutMix: soft targets, top-1 against the dominant label
            images, target = self.mix(images, target)
        parts = micro_batches(images, target, self.accumulate)
        n = target.shape[0]
        self.optimizer.zero_grad(set_to_none=True)
        for i, (x, y) in enumerate(parts):
            with self.task.no_sync() if i < len(parts) - 1 else contextlib.nullcontext():
                out = self.task(x, y)
                watch.update(out["loss"], step)
                self.scaler.scale(out["loss"] * (y.shape[0] / n)).backward()
            sums.update(
                out["loss"].detach() * y.shape[0],
                out["output"],
                hard_labels(y),
                {k: v for k, v in out.items() if k not in ("loss", "output")},
            )
        if self.clip_params:
            self.scaler.unscale_(self.optimizer)  # clip the true gradients; step() does not unscale twice
            torch.nn.utils.clip_grad_norm_(self.clip_params, self.clip)
        self.scaler.step(self.optimizer)  # AdaptiveLR's pre-step hook runs here, on unscaled gradients
        self.scaler.update()
        if self.ema is not None:
            self.ema.update()
