"""data.train_size / data.val_size for every dataset kind: a seeded subset, selected in place.

The dataset keeps its type and attributes (class names, CIFAR/MNIST arrays, ImageFolder samples), so the
loaders, the on-device path and the class-name checks see an ordinary, smaller dataset. The subset is a
function of the size alone (indices drawn with a fixed seed, then sorted): the same images for every
trainer.seed, so runs that differ only in the seed compare on the same data. FakeData takes its size directly.
"""

import torch

from ..errors import DataError

SUBSET_SEED = 0


def subset_indices(n, size):
    """``size`` of range(n), drawn without replacement with SUBSET_SEED, in increasing order."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(SUBSET_SEED))[:size].sort().values.tolist()


def take_subset(ds, size, key):
    """Keep ``size`` images of ``ds`` in place (``key``: the config key, for messages); None keeps them all."""
    if size is None:
        return ds
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise DataError(f"{key} must be a positive number of images or null (all), got {size!r}.")
    if size > len(ds):
        raise DataError(
            f"{key}={size} is more than the {len(ds)} images of the set; use at most {len(ds)} or null (all)."
        )
    idx = subset_indices(len(ds), size)
    if hasattr(ds, "samples"):  # ImageFolder (CIFAR folders, ImageNet)
        ds.samples = [ds.samples[i] for i in idx]
        ds.imgs, ds.targets = ds.samples, [target for _, target in ds.samples]
    elif hasattr(ds, "data") and hasattr(ds, "targets"):  # torchvision CIFAR (numpy, list) and MNIST (tensors)
        ds.data = ds.data[torch.as_tensor(idx)] if torch.is_tensor(ds.data) else ds.data[idx]
        ds.targets = ds.targets[torch.as_tensor(idx)] if torch.is_tensor(ds.targets) else [ds.targets[i] for i in idx]
    else:
        raise DataError(f"{key} is not supported for a {type(ds).__name__} dataset; use null (all images).")
    return ds
