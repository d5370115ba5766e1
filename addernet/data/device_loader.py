"""The tensor-resident pipeline (``data.on_device=true``): no workers, no per-image Python.

For small datasets (CIFAR, MNIST, FakeData) the per-image PIL path costs more than a small model's
step. Here the decoded split is held as one uint8 N x C x H x W tensor on the training device, the
CPU included (decoded once: torchvision CIFAR's and MNIST's ``dataset.data`` as is, an ImageFolder
or FakeData through PIL, in the order of the dataset's samples). Every batch is gathered, cropped,
flipped and normalised there in a few tensor ops, giving float32 N x C x size x size batches like
the torchvision path (data.transform ``cifar``: RandomCrop(size, padding=4) + RandomHorizontalFlip for
training, CenterCrop(size) for validation; ``plain``: no augmentation).

Randomness, so that resume stays exact: the shuffle is DistributedSampler's (a function of
(seed, epoch), so each rank gets the same share as on the torchvision path), and each epoch's crop
offsets and flips are drawn up front, at ``iter()``, from ``self.generator``, which
addernet.data.seed_epoch reseeds with epoch_seed(seed, epoch, rank) like the DataLoader's. The
draws are made on the CPU, so an epoch is the same on every device; ``iter_from(step)`` starts an
epoch at a later batch by slicing those draws (a mid-epoch resume augments nothing it skips).
The crops and flips follow torchvision's distributions, not its random stream: the images of an
epoch differ from the torchvision path's (tests/test_device_loader.py checks both properties).
"""

import logging
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DistributedSampler, Subset
from torchvision import datasets as tvd

from ..errors import DataError

TRANSFORMS = ("cifar", "plain")
log = logging.getLogger("addernet.data")
PADDING = 4  # RandomCrop(size, padding=4) of the CIFAR recipe (addernet/data/transforms.py)


def check_on_device(data_cfg):
    """DataError unless data.on_device=true can serve this dataset and transform."""
    kind = data_cfg.get("kind")
    if kind not in ("torchvision", "fake") and not (kind == "folder" and data_cfg.get("native_size")):
        raise DataError(
            f"data.on_device=true holds a whole split as one tensor, so its images must have one size: "
            f"data={data_cfg.name} (data.kind={kind}) does not say one (data.native_size); use "
            f"data.on_device=false."
        )
    if data_cfg.transform not in TRANSFORMS:
        raise DataError(
            f"data.on_device=true implements data.transform={' or '.join(TRANSFORMS)}, not "
            f"{data_cfg.transform!r}; use data.on_device=false for that transform."
        )


def decode(dataset, indices=None):
    """(images uint8 N x C x H x W, targets int64 N) of a CIFAR, MNIST, ImageFolder or FakeData dataset (or a
    Subset of one, such as the calibration set of addernet.quant), untransformed; ``indices`` selects samples."""
    if isinstance(dataset, Subset):
        picked = list(dataset.indices)
        return decode(dataset.dataset, picked if indices is None else [picked[i] for i in indices])
    rows = slice(None) if indices is None else torch.as_tensor(list(indices), dtype=torch.int64)
    if isinstance(dataset, tvd.CIFAR10):  # CIFAR100 too: already decoded, N x H x W x C
        images = torch.from_numpy(np.ascontiguousarray(dataset.data))[rows]
        return (images.permute(0, 3, 1, 2).contiguous(), torch.as_tensor(dataset.targets, dtype=torch.int64)[rows])
    if isinstance(dataset, tvd.MNIST):  # already decoded, uint8 N x H x W
        return dataset.data[rows].unsqueeze(1).contiguous(), dataset.targets.to(torch.int64)[rows]
    saved, dataset.transform = dataset.transform, None  # ImageFolder / FakeData then return PIL images
    try:
        pairs = [dataset[i] for i in (range(len(dataset)) if indices is None else indices)]
    finally:
        dataset.transform = saved
    if not pairs:
        raise DataError(
            "data.on_device=true: the dataset is empty; point data.root / data.train_dir / "
            "data.val_dir at a folder with images."
        )
    arrays = [np.asarray(img) for img, _ in pairs]
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        raise DataError(
            f"data.on_device=true needs images of one size, found {len(shapes)} sizes "
            f"({', '.join(map(str, sorted(shapes)[:3]))}, ...); resize the dataset or use "
            f"data.on_device=false."
        )
    images = torch.from_numpy(np.stack(arrays))
    images = images.unsqueeze(1) if images.dim() == 3 else images.permute(0, 3, 1, 2)
    return images.contiguous(), torch.as_tensor([t for _, t in pairs], dtype=torch.int64)


class DeviceLoader:
    """Batches (images float32 B x C x size x size, targets int64 B) of one split, on ``device``.

    Used like the DataLoader of addernet.data.build_loader: ``len()`` is the number of batches,
    ``.dataset`` is the dataset (for validation a Subset of this rank's shard, as there), and for
    training ``.sampler.set_epoch`` / ``.generator`` are what seed_epoch reseeds.
    """

    def __init__(
        self,
        dataset,
        images,
        targets,
        *,
        batch_size,
        train,
        transform,
        image_size,
        mean,
        std,
        rank=0,
        world_size=1,
        seed=0,
        device=None,
    ):
        device = torch.device(device or "cpu")
        n, channels, height, width = images.shape
        self.size, self.batch_size, self.train = int(image_size), int(batch_size), bool(train)
        self.augment = self.train and transform == "cifar"
        if self.size > min(height, width):
            raise DataError(
                f"data.image_size={self.size} is larger than the images ({height}x{width}); "
                f"set data.image_size<={min(height, width)}."
            )
        if len(mean) != channels or len(std) != channels:
            raise DataError(
                f"the images have {channels} channel(s) but data.mean/std give {len(mean)}/{len(std)} "
                f"values; give one per channel (and data.in_channels={channels})."
            )
        self.images = images.to(device)
        self.targets = targets.to(device)
        self.mean = torch.tensor(mean, dtype=torch.float32, device=device).view(1, -1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32, device=device).view(1, -1, 1, 1)
        self.device = device
        if self.train:
            self.dataset = dataset
            self.sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=int(seed))
            self.generator = torch.Generator().manual_seed(int(seed))
            # As build_loader: a final batch of one sample would break BatchNorm in training mode.
            self.drop_last = len(self.sampler) % self.batch_size == 1
        else:
            self.dataset = Subset(dataset, range(rank, n, world_size))
            self.drop_last = False

    def __len__(self):
        n = len(self.sampler) if self.train else len(self.dataset)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self):
        return self.iter_from(0)

    def iter_from(self, step):
        """This epoch's batches from batch ``step`` on; the epoch's draws are made now, in full."""
        order, offsets, flips = self.draw()
        return self._batches(order, offsets, flips, int(step))

    def draw(self):
        """(sample indices, crop offsets (top, left) N x 2, flips N) of one epoch, on the CPU.

        Training: the sampler's order, offsets uniform in [0, H + 8 - size] x [0, W + 8 - size]
        (torchvision's RandomCrop: randint(0, padded - size + 1)), flip where a uniform draw < 0.5
        (RandomHorizontalFlip(p=0.5)), in that order from ``self.generator``. Validation: the
        shard in order, the centre crop (CenterCrop's round((H - size) / 2)), no flips.
        """
        h, w = self.images.shape[2:]
        if self.train:
            order = torch.tensor(list(self.sampler), dtype=torch.int64)[: len(self) * self.batch_size]
        else:
            order = torch.tensor(list(self.dataset.indices), dtype=torch.int64)
        if not self.augment:  # validation, or data.transform=plain
            centre = torch.tensor([self.centre()]).expand(len(order), 2)
            return order, centre, torch.zeros(len(order), dtype=torch.bool)
        top = torch.randint(0, h + 2 * PADDING - self.size + 1, (len(order),), generator=self.generator)
        left = torch.randint(0, w + 2 * PADDING - self.size + 1, (len(order),), generator=self.generator)
        flips = torch.rand(len(order), generator=self.generator) < 0.5
        return order, torch.stack([top, left], 1), flips

    def centre(self):
        """(top, left) of CenterCrop(size): round((H - size) / 2), round((W - size) / 2)."""
        height, width = self.images.shape[2:]
        return int(round((height - self.size) / 2)), int(round((width - self.size) / 2))

    def _batches(self, order, offsets, flips, start):
        order, offsets, flips = (t.to(self.device) for t in (order, offsets, flips))
        for b in range(start, len(self)):
            rows = slice(b * self.batch_size, (b + 1) * self.batch_size)
            index = order[rows]
            yield self.crop(index, offsets[rows], flips[rows]), self.targets[index]

    def crop(self, index, offsets, flips):
        """Images ``index`` cropped at ``offsets`` (in padded coordinates when augmenting), flipped, normalised."""
        images = self.images[index]
        if not self.augment:  # the same centre crop for every image (none at native size): a slice, no gather
            top, left = self.centre()
            images = images[:, :, top : top + self.size, left : left + self.size]
            return images.float().div_(255).sub_(self.mean).div_(self.std)
        images = F.pad(images, (PADDING,) * 4)  # zeros, like RandomCrop(padding=4)'s fill=0
        steps = torch.arange(self.size, device=self.device)
        rows = offsets[:, :1] + steps
        cols = offsets[:, 1:] + torch.where(flips[:, None], self.size - 1 - steps, steps)  # flip = read backwards
        b = torch.arange(len(index), device=self.device).view(-1, 1, 1, 1)
        c = torch.arange(images.shape[1], device=self.device).view(1, -1, 1, 1)
        images = images[b, c, rows[:, None, :, None], cols[:, None, None, :]]
        # ToTensor + Normalize, the same float operations in the same order (bit-identical results).
        return images.float().div_(255).sub_(self.mean).div_(self.std)


def build_device_loader(data_cfg, split, dataset, *, per_rank, rank, world_size, seed, device):
    """DeviceLoader for ``split`` of ``dataset`` (see addernet.data.build_loader)."""
    check_on_device(data_cfg)
    images, targets = decode(dataset)
    log.info(
        "data.on_device: %s split held on %s as uint8 %s (%.1f MB)",
        split,
        torch.device(device or "cpu"),
        "x".join(map(str, images.shape)),
        images.numel() / 1e6,
    )
    return DeviceLoader(
        dataset,
        images,
        targets,
        batch_size=per_rank,
        train=split == "train",
        transform=data_cfg.transform,
        image_size=data_cfg.image_size,
        mean=tuple(data_cfg.mean),
        std=tuple(data_cfg.std),
        rank=rank,
        world_size=world_size,
        seed=seed,
        device=device,
    )
