"""Checkpoint files: atomic save, safe (weights_only) load, checked loading into a model."""
from .io import CheckpointError, load_checkpoint, load_weights, save_checkpoint

__all__ = ["CheckpointError", "load_checkpoint", "load_weights", "save_checkpoint"]
