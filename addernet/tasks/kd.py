"""Logit distillation from a frozen teacher (Hinton et al., 2015): ``task=kd task.teacher=PATH``.

    loss = (1 - alpha) * CE(z_s, y) + alpha * T^2 * KL(softmax(z_t / T) || softmax(z_s / T))

CE takes task.label_smoothing (cross-entropy's own argument); the KL term does not.

The teacher (addernet.tasks.teacher.load_teacher: any checkpoint test.py reads) runs in eval mode,
under no_grad, on the same augmented batch and in the same autocast dtype as the student; it has no
trainable parameters and is never in the optimizer. Its validation accuracy is reported every epoch
(``teacher_val_top1``); parts: ``ce``, ``kd`` (the T^2-scaled KL), ``teacher_top1`` (train batches).
"""

import logging

import torch
import torch.nn.functional as F

from ..data.mix import hard_labels
from ..forward import logits_and_loss
from .base import TrainingTask, register_task
from .teacher import load_teacher

log = logging.getLogger("addernet.train")


def kd_term(student_logits, teacher_logits, temperature):
    """T^2 * KL(softmax(z_t / T) || softmax(z_s / T)), averaged over the batch (gradient only via z_s)."""
    t = float(temperature)
    return (
        F.kl_div(
            F.log_softmax(student_logits / t, dim=1),
            F.log_softmax(teacher_logits.detach() / t, dim=1),
            log_target=True,
            reduction="batchmean",
        )
        * t
        * t
    )


def batch_top1(logits, target):
    """Top-1 accuracy of a batch in percent (a device tensor: no host sync); soft targets: their dominant label."""
    return (logits.argmax(1) == hard_labels(target)).float().mean() * 100


@register_task("kd")
class KDTask(TrainingTask):
    """Student trained on (1 - alpha) CE + alpha T^2 KL to a frozen teacher's logits."""

    def __init__(self, model, cfg, student):
        super().__init__(model, cfg, student)
        self.teacher, desc = load_teacher(cfg, student)
        log.info("kd teacher %s (frozen): T=%g alpha=%g", desc, cfg.temperature, cfg.alpha)

    def eval_models(self):
        return {"teacher": self.teacher}

    def forward(self, images, target):
        with torch.no_grad(), self.autocast():
            teacher_logits = self.teacher(images)
        teacher_logits = teacher_logits.float().flatten(1)
        logits, ce = logits_and_loss(self.net, images, target, self.amp, label_smoothing=self.label_smoothing)
        kd = kd_term(logits, teacher_logits, self.cfg.temperature)
        alpha = float(self.cfg.alpha)
        return {
            "loss": (1 - alpha) * ce + alpha * kd,
            "output": logits,
            "ce": ce.detach(),
            "kd": kd.detach(),
            "teacher_top1": batch_top1(teacher_logits, target),
        }
