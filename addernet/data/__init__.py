"""Data: datasets named by ``data.name``, the paper's transforms, and loaders for one or many processes.

Interface other modules rely on: ``build_dataset(cfg.data, split)`` and
``build_loader(cfg.data, split, dataset, rank=, world_size=, seed=)`` with split "train" or "val".
"""
from .datasets import NAMES, CorruptImage, DataError, build_dataset, check_classes, class_names, take_skipped
from .loader import build_loader, epoch_seed, num_workers, seed_epoch
from .transforms import build_transform

__all__ = ["NAMES", "CorruptImage", "DataError", "build_dataset", "build_loader", "build_transform", "check_classes",
           "class_names", "epoch_seed", "num_workers", "seed_epoch", "take_skipped"]
