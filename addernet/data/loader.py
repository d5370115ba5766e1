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

Workers ignore SIGTERM and SIGINT: a scheduler (or Ctrl-C) signals the whole process group, and the
main process, not its workers, decides when to stop (after saving); it then shuts the workers down.
Because they ignore SIGTERM, an iterator still alive at exit (one kept by the traceback of an error
raised from a worker, say) would make multiprocessing's exit handler, which terminates daemonic
children with SIGTERM and then joins them, wait forever: an atexit hook kills such workers first.
"""

import atexit
import gc
import multiprocessing
import os
import random
import signal

import torch
from torch.utils.data import DataLoader, DistributedSampler, Subset, default_collate

from .datasets import DataError, build_dataset
from .device_loader import build_device_loader


def _split_batch(data_cfg, world_size, split):
    batch = int(data_cfg.batch_size)
    if batch <= 0 or batch % world_size:
        raise DataError(
            f"data.batch_size={batch} is the global batch and must be a positive multiple of the "
            f"number of processes ({world_size}); change data.batch_size or the process count."
        )
    if split == "train" and batch // world_size < 2:
        raise DataError(
            f"data.batch_size={batch} gives {batch // world_size} sample per process and training "
            f"batch, and BatchNorm needs at least 2; use data.batch_size={2 * world_size} or more."
        )
    return batch // world_size


def num_workers(data_cfg):
    """data.num_workers, where ``auto`` is the CPUs this process may use, shared by the processes of this
    machine (torchrun's LOCAL_WORLD_SIZE), at most 8 (what DataLoader suggests, so it never warns)."""
    value = data_cfg.num_workers
    if value != "auto":
        return int(value)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(8, cpus // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))


def ignore_stop_signals(worker_id):
    """DataLoader worker_init_fn: leave SIGTERM/SIGINT to the main process (it saves, then stops the workers).

    It touches no RNG, so every worker's seed stays the loader generator's base seed + worker id.
    """
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def kill_workers_left_at_exit():
    """atexit: shut down the DataLoader workers still alive; they ignore SIGTERM.

    A garbage collection first frees iterators kept only by reference cycles (a traceback), whose
    ``__del__`` stops their workers the normal way; any daemonic child left after that is killed,
    with DataLoader's SIGCHLD handler removed so the kill is not reported as a worker failure.
    """
    gc.collect()
    left = [child for child in multiprocessing.active_children() if child.daemon]
    if left:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for child in left:
        child.kill()


def collate_readable(batch):
    """default_collate of the samples that are not None (None: an unreadable image skipped by the dataset)."""
    kept = [sample for sample in batch if sample is not None]
    if not kept:
        raise DataError(
            f"all {len(batch)} images of a batch are unreadable (data.skip_corrupt=true skipped them); "
            f"check the image files named in the warnings above."
        )
    return default_collate(kept)


def build_loader(data_cfg, split, dataset=None, *, rank=0, world_size=1, seed=0, device=None):
    """DataLoader for ``split`` over ``dataset`` (default: build_dataset(data_cfg, split)), this rank's share.

    ``data.batch_size`` is the global batch (the paper's 256), split evenly across processes.
    With data.on_device=true: a DeviceLoader holding the split on ``device`` (default CPU).
    """
    if dataset is None:
        dataset = build_dataset(data_cfg, split)
    per_rank = _split_batch(data_cfg, world_size, split)
    if data_cfg.on_device:
        return build_device_loader(
            data_cfg, split, dataset, per_rank=per_rank, rank=rank, world_size=world_size, seed=seed, device=device
        )
    workers = num_workers(data_cfg)
    if workers:  # registered after multiprocessing's own exit handler, so it runs before it
        atexit.unregister(kill_workers_left_at_exit)
        atexit.register(kill_workers_left_at_exit)
    common = dict(
        num_workers=workers,
        pin_memory=bool(data_cfg.pin_memory) and torch.cuda.is_available(),  # no-op without a GPU
        generator=torch.Generator().manual_seed(int(seed)),
        worker_init_fn=ignore_stop_signals if workers else None,
        collate_fn=collate_readable if data_cfg.skip_corrupt else None,
    )
    if split == "train":
        sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=int(seed))
        if len(sampler) < 2:
            raise DataError(
                f"the training set has {len(dataset)} image(s), fewer than 2 per process "
                f"({world_size} process(es)); BatchNorm needs 2 per batch: use a larger training set."
            )
        # A final batch of one sample would break BatchNorm in training mode: drop it.
        return DataLoader(
            dataset, batch_size=per_rank, sampler=sampler, drop_last=len(sampler) % per_rank == 1, **common
        )
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


def iter_from(loader, step=0):
    """An iterator over ``loader``'s current epoch that starts at batch ``step`` (mid-epoch resume).

    A DeviceLoader slices its epoch's draws (skipped batches cost nothing); a DataLoader loads and
    discards the first ``step`` batches, the only way to keep its random stream. Its workers are shut
    down as soon as the iteration ends, by an error too: left to DataLoader's own ``__del__``, the
    iterator an error's traceback keeps is freed by a later garbage collection, where its workers
    miss the stop message and the collection waits 10 s for them.
    """
    if hasattr(loader, "iter_from"):
        return loader.iter_from(step)
    batches = iter(loader)  # now, not at the first batch: it draws the epoch's worker seeds
    try:
        for _ in range(step):
            next(batches)
    except BaseException:
        _shutdown_workers(batches)
        raise
    return _shut_down_at_the_end(batches)


def _shut_down_at_the_end(batches):
    try:
        yield from batches
    finally:
        _shutdown_workers(batches)


def _shutdown_workers(batches):
    getattr(batches, "_shutdown_workers", lambda: None)()  # what DataLoader's __del__ calls
