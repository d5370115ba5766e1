"""Data: datasets named by ``data.name``, the paper's transforms, and loaders for one or many processes.

Interface other modules rely on: ``build_dataset(cfg.data, split)`` and
``build_loader(cfg.data, split, dataset, rank=, world_size=, seed=)`` with split "train" or "val".
"""
from .datasets import NAMES, DataError, build_dataset
from .loader import build_loader, epoch_seed, seed_epoch
from .transforms import build_transform

__all__ = ["NAMES", "DataError", "build_dataset", "build_loader", "build_transform", "epoch_seed", "seed_epoch"]
