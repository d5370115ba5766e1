"""Supervised classification with cross-entropy: the paper's training method (the default task)."""

from ..forward import logits_and_loss
from .base import TrainingTask, register_task


@register_task("classification")
class ClassificationTask(TrainingTask):
    """loss = CE(model(images), target) (with task.label_smoothing); no extra modules, no extra parts."""

    def forward(self, images, target):
        logits, loss = logits_and_loss(self.net, images, target, self.amp, label_smoothing=self.label_smoothing)
        return {"loss": loss, "output": logits}
