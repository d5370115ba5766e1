"""DataLoaders whose randomness is a pure function of (seed, epoch), and exact sharded validation.

Training uses DistributedSampler on any number of processes (one process = a world of 1): its
shuffle depends only on (seed, epoch) via ``set_epoch``. Augmentation randomness comes from the
loader's own generator (worker seeds) or, with num_workers=0, the global torch RNG; the trainer
reseeds both at every epoch start (:func:`seed_epoch`), so replaying an epoch after a crash
reproduces it bit for bit.

Validation gives each rank the indices rank, rank+world, ... in order: every sample is seen by
exactly one rank, with no padding, so summed counts are exact.

data.on_device=true returns a DeviceLoader (device_loader.py) instead: the same shuffle, shards,
drop rule and seeding, with the augmentation done in batches on the training device.
"""
import random

import torch
from torch.utils.data import DataLoader, DistributedSampler, Subset

from .datasets import DataError, build_dataset
from .device_loader import build_device_loader


def _split_batch(data_cfg, world_size):
    batch = int(data_cfg.batch_size)
    if batch <= 0 or batch % world_size:
        raise DataError(f"data.batch_size={batch} is the global batch and must be a positive multiple of the "
                        f"number of processes ({world_size}); change data.batch_size or the process count.")
    return batch // world_size


def build_loader(data_cfg, split, dataset=None, *, rank=0, world_size=1, seed=0, device=None):
    """DataLoader for ``split`` over ``dataset`` (default: build_dataset(data_cfg, split)), this rank's share.

    ``data.batch_size`` is the global batch (the paper's 256), split evenly across processes.
    With data.on_device=true: a DeviceLoader holding the split on ``device`` (default CPU).
    """
    if dataset is None:
        dataset = build_dataset(data_cfg, split)
    per_rank = _split_batch(data_cfg, world_size)
    if data_cfg.get("on_device", False):
        return build_device_loader(data_cfg, split, dataset, per_rank=per_rank, rank=rank, world_size=world_size,
                                   seed=seed, device=device)
    common = dict(num_workers=int(data_cfg.num_workers),
                  pin_memory=bool(data_cfg.pin_memory) and torch.cuda.is_available(),  # no-op without a GPU
                  generator=torch.Generator().manual_seed(int(seed)))
    if split == "train":
        sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=int(seed))
        # A final batch of one sample would break BatchNorm in training mode: drop it.
        return DataLoader(dataset, batch_size=per_rank, sampler=sampler,
                          drop_last=len(sampler) % per_rank == 1, **common)
    shard = Subset(dataset, range(rank, len(dataset), world_size))
    return DataLoader(shard, batch_size=per_rank, shuffle=False, **common)


def epoch_seed(seed, epoch, rank=0):
    """Seed for one (seed, epoch, rank); distinct for every combination in practice."""
    return (int(seed) * 1_000_003 + int(epoch) * 1009 + int(rank)) % (2**63)


def seed_epoch(loader, seed, epoch, rank=0):
    """Make this epoch's data order and augmentation a pure function of (seed, epoch, rank).

    Works for a DataLoader and a DeviceLoader alike (both have .sampler and .generator).
    """
    s = epoch_seed(seed, epoch, rank)
    loader.sampler.set_epoch(epoch)  # shuffle: (seed, epoch), identical on every rank
    loader.generator.manual_seed(s)  # worker base seed for this epoch's iterator
    torch.manual_seed(s)  # augmentation in the main process (num_workers=0), any model randomness
    random.seed(s)


def iter_from(loader, step):
    """An iterator over ``loader``'s current epoch that starts at batch ``step`` (mid-epoch resume).

    A DeviceLoader slices its epoch's draws (skipped batches cost nothing); a DataLoader loads and
    discards the first ``step`` batches, the only way to keep its random stream.
    """
    if hasattr(loader, "iter_from"):
        return loader.iter_from(step)
    batches = iter(loader)
    for _ in range(step):
        next(batches)
    return batches
