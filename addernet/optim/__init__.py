"""Optimisation: AdderNet's adaptive learning rate, and optimizer / schedule factories by config name."""

from .adaptive_lr import AdaptiveLR
from .factory import OPTIMIZERS, SCHEDULERS, build_optimizer, build_scheduler, check_name

__all__ = ["AdaptiveLR", "OPTIMIZERS", "SCHEDULERS", "build_optimizer", "build_scheduler", "check_name"]
