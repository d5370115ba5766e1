"""Checkpoint files: atomic save, safe (weights_only) load, checked loading into a model, the format."""

from ..errors import CheckpointError
from .format import (
    FORMAT_VERSION,
    OFFICIAL,
    check_training_checkpoint,
    open_checkpoint,
    read_checkpoint,
    training_checkpoint,
)
from .io import load_checkpoint, load_weights, save_checkpoint

__all__ = [
    "CheckpointError",
    "FORMAT_VERSION",
    "OFFICIAL",
    "check_training_checkpoint",
    "load_checkpoint",
    "load_weights",
    "open_checkpoint",
    "read_checkpoint",
    "save_checkpoint",
    "training_checkpoint",
]
