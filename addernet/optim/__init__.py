"""Optimisation helpers specific to AdderNet."""
from .adaptive_lr import AdaptiveLR

__all__ = ["AdaptiveLR"]
