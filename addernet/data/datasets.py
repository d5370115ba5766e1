"""Datasets by kind (``data.kind``): a torchvision dataset class, an ImageFolder tree, or FakeData.

A data config names its kind and what the kind needs (``data.dataset``: the torchvision class;
``data.train_dir``/``data.val_dir``: the folders), so a new dataset of an existing kind is one YAML file
in configs/data/. A new kind is a function ``(data_cfg, split, transform) -> Dataset`` decorated with
``@register_dataset_kind(name)``.

A missing dataset becomes a :class:`DataError` that names the folder, the files expected there and
the override that fixes it, instead of torchvision's generic "Dataset not found". An unreadable image
is named with its dataset (:class:`CorruptImage`), or skipped and counted with data.skip_corrupt=true.
Labels are the positions of the sorted class names, so datasets that have names (ImageFolder trees,
CIFAR, MNIST) are compared by name (:func:`check_classes`): a renamed folder is an error, not a shift.
"""

import logging
import multiprocessing
import os
import unicodedata

import numpy as np
from PIL import Image
from torchvision import datasets as tvd

from ..checks import number
from ..config import config_dir
from ..errors import ConfigError, DataError
from ..registry import registrar
from .subset import take_subset
from .transforms import build_transform

DATASET_KINDS = {}
EMPTY_HINT = {"folder": "data.{split}_dir", "fake": "data.{split}_size"}  # what to check for an empty split
log = logging.getLogger("addernet.data")


class CorruptImage(DataError):
    """An image file cannot be decoded. DataLoader re-raises a worker's error with the worker's traceback as
    its message: only our own line (the last one) is kept, so the user sees one line naming the file."""

    def __init__(self, message):
        if "Traceback (most recent call last)" in message:
            message = message.rstrip().splitlines()[-1].split(": ", 1)[-1]
        super().__init__(message)


HIGH_BIT_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I")  # PIL's modes of 16-bit greyscale PNG/TIFF files


def load_rgb(path):
    """An image file as 8-bit RGB. 16-bit greyscale files are scaled to 8 bits (PIL's convert("RGB") clips
    every value above 255, which turns a 16-bit image all white); a decompression bomb raises (PIL's check)."""
    with open(path, "rb") as f:
        image = Image.open(f)
        image.load()
    if image.mode in HIGH_BIT_MODES:
        values = np.asarray(image, dtype=np.int64)
        image = Image.fromarray((values.clip(0, 65535) >> 8).astype(np.uint8), "L")
    return image.convert("RGB")


def _walk_once(directory, extensions):
    """Image files under ``directory`` (symlinks followed), each folder visited once: a symlink loop or a
    second link to a visited folder is not walked again. Sorted like torchvision's make_dataset."""
    seen, files = set(), []
    for root, dirs, names in os.walk(directory, followlinks=True):
        real = os.path.realpath(root)
        if real in seen:
            dirs[:] = []
            continue
        seen.add(real)
        dirs.sort()
        files += [os.path.join(root, n) for n in sorted(names) if n.lower().endswith(extensions)]
    return files


class CheckedImageFolder(tvd.ImageFolder):
    """ImageFolder that names an unreadable image and its dataset, or (``skip``) skips it and counts it.

    A skipped sample is None (the loader's collate drops it); ``skipped`` is a counter shared with
    the DataLoader workers, read and reset by :func:`take_skipped`. Every image file is counted once
    (symlinked folders and files are followed, but a file or folder reached twice is kept once), 16-bit
    greyscale images are scaled to 8 bits, and ``native`` (an int) refuses images of another size.
    """

    def __init__(self, root, transform, name, skip, native=None):
        self.name, self.native = name, native
        super().__init__(root, transform=transform, loader=load_rgb)
        self.skip, self.skipped = bool(skip), multiprocessing.Value("q", 0)

    def make_dataset(self, directory, class_to_idx, extensions=None, is_valid_file=None, allow_empty=False):
        found, best = [], {}  # every (path, label) reached; the most direct path (fewest folders) per real file
        for cls in sorted(class_to_idx):
            for path in _walk_once(os.path.join(directory, cls), tuple(extensions or tvd.folder.IMG_EXTENSIONS)):
                real = os.path.realpath(path)
                found.append((path, class_to_idx[cls]))
                if real not in best or path.count(os.sep) < best[real].count(os.sep):
                    best[real] = path
        samples = [(p, t) for p, t in found if best[os.path.realpath(p)] == p]
        twice = len(found) - len(samples)
        if twice:
            log.warning(
                "%s: %d image file(s) under %s are reached twice through symlinks; each is counted once",
                self.name,
                twice,
                directory,
            )
        if not samples and not allow_empty:
            raise FileNotFoundError(f"found no valid image file in the class folders of {directory}")
        return samples

    def __getitem__(self, index):
        path, target = self.samples[index]
        try:
            image = self.loader(path)
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
            # PIL: unidentified, truncated, broken chunks, more pixels than PIL's decompression-bomb limit
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            if not self.skip:
                raise CorruptImage(
                    f"{self.name}: cannot read image {path} ({reason}); replace or delete it, or "
                    f"set data.skip_corrupt=true to skip unreadable images (counted per epoch)."
                ) from None
            with self.skipped.get_lock():
                self.skipped.value += 1
            log.warning("%s: skipped unreadable image %s (%s)", self.name, path, reason)
            return None
        if self.native and image.size != (self.native, self.native):
            raise DataError(
                f"{self.name}: image {path} is {image.size[0]}x{image.size[1]}, but this dataset's "
                f"images are {self.native}x{self.native}; its crop would keep only part of the image. "
                f"Resize the folder's images to {self.native}x{self.native}, or read it as "
                f"data=imagenet (resize, then crop)."
            )
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
    detail = (
        f"{where} has {_names(extra)} where {source} has {_names(missing)}"
        if extra or missing
        else "the same names in another order"
    )
    forms = [
        (a, b) for a in extra for b in missing if unicodedata.normalize("NFC", a) == unicodedata.normalize("NFC", b)
    ]
    if forms:  # they print alike: show the code points
        a, b = forms[0]
        detail += (
            f" ({a!r} and {b!r} are the same name in different Unicode forms: {ascii(a)} vs {ascii(b)}, e.g. "
            f"NFD vs NFC, as some file systems and archivers write them; rename the folder to the training "
            f"set's form)"
        )
    raise DataError(
        f"the classes of {where} do not match {source}: {detail}. Labels are the positions of the "
        f"sorted class names, so this would silently score the wrong classes; {fix}."
    )


def _expected_files(cls, root):
    if issubclass(cls, tvd.CIFAR10):  # CIFAR100 subclasses CIFAR10
        folder = os.path.join(root, cls.base_folder)
        names = [f for f, _ in cls.train_list + cls.test_list] + [cls.meta["filename"]]
    else:
        folder = os.path.join(root, cls.__name__, "raw")
        names = [os.path.splitext(f)[0] for f, _ in cls.resources]
    return folder, names


# @register_dataset_kind(kind): ``fn(data_cfg, split, transform) -> Dataset`` becomes ``data.kind=<kind>``
register_dataset_kind = registrar(DATASET_KINDS, "dataset kind")


@register_dataset_kind("torchvision")
def torchvision_dataset(data_cfg, split, transform):
    """``data.dataset``: a torchvision.datasets class with a ``train=`` split (CIFAR10, CIFAR100, MNIST, ...)."""
    name = str(data_cfg.get("dataset"))
    cls = getattr(tvd, name, None)
    if not (isinstance(cls, type) and issubclass(cls, (tvd.CIFAR10, tvd.MNIST))):
        raise DataError(
            f"data.dataset={name!r} is not a torchvision dataset with a train/test split; use CIFAR10, "
            f"CIFAR100, MNIST or an MNIST-like class (FashionMNIST, KMNIST), or data.kind=folder."
        )
    root = os.path.abspath(data_cfg.root)
    try:
        return cls(root, train=split == "train", download=bool(data_cfg.download), transform=transform)
    except (RuntimeError, OSError) as e:  # not found / corrupt / no network (URLError is an OSError)
        folder, names = _expected_files(cls, root)
        sub = os.path.relpath(folder, root)
        layout = f"<data.root>/{sub}/{{{', '.join(names)}}}"
        get = f"python -c \"import torchvision; torchvision.datasets.{cls.__name__}('data', download=True)\""
        images = _image_folder_hint(data_cfg, root)
        if data_cfg.download:
            source = getattr(cls, "url", None) or " or ".join(getattr(cls, "mirrors", ()))
            raise DataError(
                f"{cls.__name__} is not in {folder} and the download from {source} failed ({_reason(e)}). "
                f"{images}Without network access here, run {get} on a machine that has it, copy the data/ folder "
                f"it writes, and set data.root=<the copy> (layout {layout})."
            ) from None
        raise DataError(
            f"{cls.__name__} is not in {folder}, or its files fail their checksum (data.download=false). "
            f"{images}Put the files there (layout {layout}), set data.root=<folder holding {sub}/>, or set "
            f"data.download=true with network access (or run {get} where there is network and copy data/)."
        ) from None


def _holds_class_folders(path):
    """Whether ``path`` is an ImageFolder: a sub-folder of it holds an image file (the first few looked at)."""
    try:
        classes = sorted(e.path for e in os.scandir(path) if e.is_dir())[:4]
        return any(
            f.is_file() and f.name.lower().endswith(tvd.folder.IMG_EXTENSIONS) for c in classes for f in os.scandir(c)
        )
    except OSError:
        return False


def _image_folder_hint(data_cfg, root):
    """The sentence that names the image-folder dataset when ``root`` holds image files instead of the torchvision
    files (<root>/train and <root>/test ImageFolders, or an ImageFolder itself) and that dataset exists, else ''."""
    option = f"data={data_cfg.name}_folder"
    if not os.path.isfile(os.path.join(config_dir(), "data", f"{data_cfg.name}_folder.yaml")):
        return ""
    if any(_holds_class_folders(os.path.join(root, split)) for split in ("train", "test")):
        return f"{root} holds image folders (train/, test/): read them with {option} data.root={root}. "
    if _holds_class_folders(root):
        return f"{root} is an image folder (<class>/<image>): evaluate it with {option} data.val_dir={root}. "
    return ""


def _reason(error):
    """An exception's whole message on one line (torchvision puts the URLs it tried on the lines after the first)."""
    text = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    return (text[:600] + " ...") if len(text) > 600 else text or type(error).__name__


@register_dataset_kind("folder")
def folder_dataset(data_cfg, split, transform):
    """An ImageFolder tree ``data.train_dir`` / ``data.val_dir``; ``data.native_size``: the one size every image has
    (a crop of a larger image would keep a part of it), or null for images of any size."""
    given = str(data_cfg.train_dir if split == "train" else data_cfg.val_dir)
    key = "data.train_dir" if split == "train" else "data.val_dir"
    if data_cfg.get("root") is None and given.split("/")[0] == "None":  # ${data.root}/train with data.root=null
        raise DataError(
            f"data.root is null, but {key}={given} is made from it (data={data_cfg.name}); set data.root=<the "
            f"folder holding train/ and {os.path.basename(str(data_cfg.val_dir))}/>, or {key}=/path/to/imagefolder."
        )
    path = os.path.abspath(given)
    if not os.path.isdir(path):
        raise DataError(
            f"{data_cfg.name}: image folder {path} does not exist. Expected an ImageFolder tree "
            f"<{key}>/<class>/<image>; set data.root=... (the folder holding train/ and "
            f"{os.path.basename(str(data_cfg.val_dir))}/) or {key}=/path/to/imagefolder."
        )
    try:
        ds = CheckedImageFolder(
            path,
            transform,
            f"{data_cfg.name} {split} set",
            bool(data_cfg.skip_corrupt),
            native=data_cfg.native_size,
        )
    except (FileNotFoundError, OSError) as e:
        raise DataError(
            f"{data_cfg.name}: {path} is not a usable ImageFolder tree ({e}); expected <class>/<image> sub-folders."
        ) from None
    if len(ds.classes) != int(data_cfg.num_classes):
        raise DataError(
            f"{data_cfg.name}: {path} has {len(ds.classes)} class folders but data.num_classes="
            f"{data_cfg.num_classes}; point {key} at the right folder or set data.num_classes."
        )
    return ds


def check_data_values(data_cfg):
    """ConfigError for a data setting that would fail deep inside torchvision or read the wrong place, checked
    before anything is built or downloaded: the image sizes, the subset sizes, and where the data lies."""
    name = f"data={data_cfg.get('name')}"
    number(data_cfg, "image_size", "data.image_size", minimum=1, integer=True, example=32)
    fake = data_cfg.get("kind") == "fake"
    for key in ("train_size", "val_size"):
        value = data_cfg.get(key)
        if value is None and not fake:
            continue  # all images
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            size = "the number of random images" if fake else "a number of images"
            raise ConfigError(
                f"data.{key} must be {size} (an integer >= 1){'' if fake else ' or null (all images)'}, got "
                f"{'null' if value is None else repr(value)}; e.g. data.{key}={64 if fake else 1000}."
            )
    native = data_cfg.get("native_size")
    if native is not None and (isinstance(native, bool) or not isinstance(native, int) or native < 1):
        raise ConfigError(
            f"data.native_size must be the side every image of the folder has (an integer >= 1) or null (any "
            f"size), got {native!r}; e.g. data.native_size=32."
        )
    for key in ("root", "train_dir", "val_dir"):
        value = data_cfg.get(key)
        if isinstance(value, str) and not value.strip():
            raise ConfigError(
                f"data.{key} is empty (an unset shell variable?), so {name} would read the current directory "
                f"or the file system's root; give the folder, e.g. data.{key}=/path/to/data."
            )
    if data_cfg.get("kind") == "torchvision" and data_cfg.get("root") is None:
        raise ConfigError(
            f"data.root is null, but {name} reads its files from data.root; set data.root=<folder> (e.g. "
            f"data.root=data, where data.download=true puts them)."
        )


def build_dataset(data_cfg, split):
    """Dataset for ``split`` ("train" or "val") from a ``data`` config node, with its transform.

    ``val`` is the held-out split the paper reports on (CIFAR/MNIST test set, ImageNet val).
    """
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    kind = data_cfg.get("kind")
    if kind not in DATASET_KINDS:
        raise DataError(
            f"data.kind={kind!r} (data={data_cfg.get('name')}) is not a dataset kind; use one of "
            f"{', '.join(DATASET_KINDS)} (configs/data/*.yaml show each)."
        )
    ds = DATASET_KINDS[kind](data_cfg, split, build_transform(data_cfg, split))
    if kind != "fake":  # FakeData is built with its size
        ds = take_subset(ds, data_cfg[f"{split}_size"], f"data.{split}_size")
    if len(ds) == 0:
        key = EMPTY_HINT.get(kind, "data.root").format(split=split)
        raise DataError(f"the {data_cfg.name} {split} set is empty (0 images); check {key}.")
    return ds


@register_dataset_kind("fake")
def fake_dataset(data_cfg, split, transform):
    """torchvision FakeData of ``data.train_size`` / ``data.val_size`` random images (different for the two splits)."""
    size = int(data_cfg.train_size if split == "train" else data_cfg.val_size)
    # Different offsets so the validation images are not the training images.
    return tvd.FakeData(
        size=size,
        image_size=(int(data_cfg.in_channels), int(data_cfg.image_size), int(data_cfg.image_size)),
        num_classes=int(data_cfg.num_classes),
        transform=transform,
        random_offset=0 if split == "train" else 10**6,
    )
