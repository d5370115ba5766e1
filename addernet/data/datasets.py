"""Datasets named by ``data.name``: torchvision's CIFAR-10/100, MNIST, FakeData and ImageFolder trees.

A missing dataset becomes a :class:`DataError` that names the folder, the files expected there and
the override that fixes it, instead of torchvision's generic "Dataset not found". An unreadable image
is named with its dataset (:class:`CorruptImage`), or skipped and counted with data.skip_corrupt=true.
Labels are the positions of the sorted class names, so datasets that have names (ImageFolder trees,
CIFAR, MNIST) are compared by name (:func:`check_classes`): a renamed folder is an error, not a shift.
"""
import logging
import multiprocessing
import os

from torchvision import datasets as tvd

from ..errors import DataError
from .subset import take_subset
from .transforms import build_transform

TORCHVISION = {"cifar10": tvd.CIFAR10, "cifar100": tvd.CIFAR100, "mnist": tvd.MNIST}
FOLDERS = ("imagenet", "cifar10_folder", "cifar100_folder")
NAMES = tuple(TORCHVISION) + FOLDERS + ("fake",)
log = logging.getLogger("addernet.data")


class CorruptImage(DataError):
    """An image file cannot be decoded. DataLoader re-raises a worker's error with the worker's traceback as
    its message: only our own line (the last one) is kept, so the user sees one line naming the file."""

    def __init__(self, message):
        if "Traceback (most recent call last)" in message:
            message = message.rstrip().splitlines()[-1].split(": ", 1)[-1]
        super().__init__(message)


class CheckedImageFolder(tvd.ImageFolder):
    """ImageFolder that names an unreadable image and its dataset, or (``skip``) skips it and counts it.

    A skipped sample is None (the loader's collate drops it); ``skipped`` is a counter shared with
    the DataLoader workers, read and reset by :func:`take_skipped`.
    """

    def __init__(self, root, transform, name, skip):
        super().__init__(root, transform=transform)
        self.name, self.skip, self.skipped = name, bool(skip), multiprocessing.Value("q", 0)

    def __getitem__(self, index):
        path, target = self.samples[index]
        try:
            image = self.loader(path)
        except (OSError, SyntaxError, ValueError) as e:  # PIL: unidentified, truncated, broken chunks
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            if not self.skip:
                raise CorruptImage(f"{self.name}: cannot read image {path} ({reason}); replace or delete it, or "
                                   f"set data.skip_corrupt=true to skip unreadable images (counted per epoch).") \
                    from None
            with self.skipped.get_lock():
                self.skipped.value += 1
            log.warning("%s: skipped unreadable image %s (%s)", self.name, path, reason)
            return None
        return (self.transform(image) if self.transform is not None else image), target


def take_skipped(loader):
    """Images the dataset of ``loader`` skipped as unreadable since the last call (then reset to 0)."""
    ds = loader.dataset
    counter = getattr(getattr(ds, "dataset", ds), "skipped", None)  # the validation loader holds a Subset
    if counter is None:
        return 0
    with counter.get_lock():
        n, counter.value = counter.value, 0
    return n


def class_names(dataset):
    """The dataset's class names in label order (ImageFolder, CIFAR, MNIST), or None (FakeData)."""
    dataset = getattr(dataset, "dataset", dataset)
    names = getattr(dataset, "classes", None)
    return [str(c) for c in names] if names is not None else None


def _names(items):
    return (", ".join(map(repr, items[:6])) + (" ..." if len(items) > 6 else "")) or "nothing"


def check_classes(expected, dataset, source, fix):
    """DataError unless ``dataset``'s class names are ``expected`` (when both are known), position by position."""
    found = class_names(dataset)
    if expected is None or found is None or list(expected) == found:
        return
    ds = getattr(dataset, "dataset", dataset)
    where = getattr(ds, "root", type(ds).__name__)
    extra, missing = [c for c in found if c not in expected], [c for c in expected if c not in found]
    detail = (f"{where} has {_names(extra)} where {source} has {_names(missing)}" if extra or missing
              else "the same names in another order")
    raise DataError(f"the classes of {where} do not match {source}: {detail}. Labels are the positions of the "
                    f"sorted class names, so this would silently score the wrong classes; {fix}.")


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
        ds = CheckedImageFolder(path, transform, f"{data_cfg.name} {split} set", data_cfg.get("skip_corrupt", False))
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
        ds = _torchvision_dataset(data_cfg, split, transform)
    elif name in FOLDERS:
        ds = _folder_dataset(data_cfg, split, transform)
    else:
        ds = _fake_dataset(data_cfg, split, transform)
    if name != "fake":  # FakeData is built with its size
        ds = take_subset(ds, data_cfg.get(f"{split}_size"), f"data.{split}_size")
    if len(ds) == 0:
        key = {"fake": f"data.{split}_size", **{f: f"data.{split}_dir" for f in FOLDERS}}.get(name, "data.root")
        raise DataError(f"the {name} {split} set is empty (0 images); check {key}.")
    return ds


def _fake_dataset(data_cfg, split, transform):
    size = int(data_cfg.train_size if split == "train" else data_cfg.val_size)
    # Different offsets so the validation images are not the training images.
    return tvd.FakeData(size=size, image_size=(int(data_cfg.in_channels), int(data_cfg.image_size),
                                               int(data_cfg.image_size)),
                        num_classes=int(data_cfg.num_classes), transform=transform,
                        random_offset=0 if split == "train" else 10**6)
