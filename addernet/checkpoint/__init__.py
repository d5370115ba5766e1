"""Checkpoint files: atomic save and safe (weights_only) load."""
from .io import CheckpointError, load_checkpoint, save_checkpoint

__all__ = ["CheckpointError", "load_checkpoint", "save_checkpoint"]
