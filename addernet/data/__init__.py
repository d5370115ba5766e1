"""Data: datasets named by ``data.name``, the paper's transforms, and loaders for one or many processes.

Interface other modules rely on: ``build_dataset(cfg.data, split)`` and
``build_loader(cfg.data, split, dataset, rank=, world_size=, seed=, device=)`` with split "train" or "val"
(a DeviceLoader when data.on_device=true).
"""
from .datasets import NAMES, DataError, build_dataset
from .device_loader import DeviceLoader
from .loader import build_loader, epoch_seed, iter_from, seed_epoch
from .transforms import build_transform

__all__ = ["NAMES", "DataError", "DeviceLoader", "build_dataset", "build_loader", "build_transform", "epoch_seed",
           "iter_from", "seed_epoch"]
