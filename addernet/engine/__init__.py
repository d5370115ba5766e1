"""Training loop (trainer.py), evaluation (evaluate.py) and exact metric sums (meters.py)."""
from .evaluate import evaluate
from .meters import MetricSums, topk_correct
from .trainer import ConfigError, NonFiniteLoss, Preempted, check_config, train

__all__ = ["ConfigError", "MetricSums", "NonFiniteLoss", "Preempted", "check_config", "evaluate", "topk_correct",
           "train"]
