"""Datasets named by ``data.name``: torchvision's CIFAR-10/100, MNIST, FakeData and ImageFolder trees.

A missing dataset becomes a :class:`DataError` that names the folder, the files expected there and
the override that fixes it, instead of torchvision's generic "Dataset not found".
"""
import os

from torchvision import datasets as tvd

from ..errors import DataError
from .transforms import build_transform

TORCHVISION = {"cifar10": tvd.CIFAR10, "cifar100": tvd.CIFAR100, "mnist": tvd.MNIST}
FOLDERS = ("imagenet", "cifar10_folder", "cifar100_folder")
NAMES = tuple(TORCHVISION) + FOLDERS + ("fake",)


def _expected_files(cls, root):
    if issubclass(cls, tvd.CIFAR10):  # CIFAR100 subclasses CIFAR10
        folder = os.path.join(root, cls.base_folder)
        names = [f for f, _ in cls.train_list + cls.test_list] + [cls.meta["filename"]]
    else:
        folder = os.path.join(root, cls.__name__, "raw")
        names = [os.path.splitext(f)[0] for f, _ in cls.resources]
    return folder, names


def _torchvision_dataset(data_cfg, split, transform):
    cls, root = TORCHVISION[data_cfg.name], os.path.abspath(data_cfg.root)
    try:
        return cls(root, train=split == "train", download=bool(data_cfg.download), transform=transform)
    except (RuntimeError, OSError) as e:  # not found / corrupt / no network (URLError is an OSError)
        folder, names = _expected_files(cls, root)
        how = ("the download failed" if data_cfg.download else "data.download=false")
        raise DataError(
            f"{cls.__name__} is not in {folder} ({how}: {str(e).splitlines()[0]}). Expected files: "
            f"{', '.join(names)}. Put them there, point data.root=/path/to/folder/holding/them, or allow "
            f"the download with data.download=true and network access.") from None


def _folder_dataset(data_cfg, split, transform):
    path = os.path.abspath(data_cfg.train_dir if split == "train" else data_cfg.val_dir)
    key = "data.train_dir" if split == "train" else "data.val_dir"
    if not os.path.isdir(path):
        raise DataError(f"{data_cfg.name}: image folder {path} does not exist. Expected an ImageFolder tree "
                        f"<{key}>/<class>/<image>; set data.root=... (the folder holding train/ and "
                        f"{os.path.basename(str(data_cfg.val_dir))}/) or {key}=/path/to/imagefolder.")
    try:
        ds = tvd.ImageFolder(path, transform=transform)
    except (FileNotFoundError, OSError) as e:
        raise DataError(f"{data_cfg.name}: {path} is not a usable ImageFolder tree ({e}); expected "
                        f"<class>/<image> sub-folders.") from None
    if len(ds.classes) != int(data_cfg.num_classes):
        raise DataError(f"{data_cfg.name}: {path} has {len(ds.classes)} class folders but data.num_classes="
                        f"{data_cfg.num_classes}; point {key} at the right folder or set data.num_classes.")
    return ds


def build_dataset(data_cfg, split):
    """Dataset for ``split`` ("train" or "val") from a ``data`` config node, with its transform.

    ``val`` is the held-out split the paper reports on (CIFAR/MNIST test set, ImageNet val).
    """
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    name = data_cfg.name
    if name not in NAMES:
        raise DataError(f"unknown dataset data.name={name!r}; choose data=<one of {', '.join(NAMES)}>.")
    transform = build_transform(data_cfg, split)
    if name in TORCHVISION:
        return _torchvision_dataset(data_cfg, split, transform)
    if name in FOLDERS:
        return _folder_dataset(data_cfg, split, transform)
    size = int(data_cfg.train_size if split == "train" else data_cfg.val_size)
    # Different offsets so the validation images are not the training images.
    return tvd.FakeData(size=size, image_size=(int(data_cfg.in_channels), int(data_cfg.image_size),
                                               int(data_cfg.image_size)),
                        num_classes=int(data_cfg.num_classes), transform=transform,
                        random_offset=0 if split == "train" else 10**6)
