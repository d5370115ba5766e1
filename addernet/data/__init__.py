"""Data: datasets by kind (``data.kind``), the paper's transforms, and loaders for one or many processes.

Interface other modules rely on: ``build_dataset(cfg.data, split)`` and
``build_loader(cfg.data, split, dataset, rank=, world_size=, seed=, device=)`` with split "train" or "val"
(a DeviceLoader when data.on_device=true).
"""

from .datasets import (
    DATASET_KINDS,
    CorruptImage,
    DataError,
    build_dataset,
    check_classes,
    check_data_values,
    class_names,
    register_dataset_kind,
    take_skipped,
)
from .device_loader import DeviceLoader
from .loader import build_loader, epoch_seed, iter_from, num_workers, seed_epoch
from .transforms import build_transform

__all__ = [
    "DATASET_KINDS",
    "CorruptImage",
    "DataError",
    "DeviceLoader",
    "build_dataset",
    "build_loader",
    "build_transform",
    "check_classes",
    "check_data_values",
    "class_names",
    "epoch_seed",
    "iter_from",
    "num_workers",
    "register_dataset_kind",
    "seed_epoch",
    "take_skipped",
]
