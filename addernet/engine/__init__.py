"""Training loop (trainer.py), evaluation (evaluate.py) and exact metric sums (meters.py)."""
from .evaluate import evaluate
from .meters import MetricSums, topk_correct
from .trainer import ConfigError, NonFiniteLoss, Preempted, check_config, device_type, model_from_config, train

__all__ = ["ConfigError", "MetricSums", "NonFiniteLoss", "Preempted", "check_config", "device_type", "evaluate",
           "model_from_config", "topk_correct", "train"]
