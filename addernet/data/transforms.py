"""The paper's input pipelines, chosen by ``data.transform``.

cifar:    RandomCrop(size, padding=4) + horizontal flip for training (the AdderNet/ResNet CIFAR recipe),
          CenterCrop(size) for validation (a no-op at CIFAR's native 32x32).
imagenet: RandomResizedCrop(size) + flip for training; Resize(size/0.875) + CenterCrop(size) for
          validation (the standard torchvision ImageNet recipe, 256 -> 224).
plain:    no augmentation (MNIST, FakeData).
Every pipeline ends with ToTensor + Normalize(data.mean, data.std).
"""
from torchvision import transforms as T

from ..errors import DataError

TRANSFORMS = ("cifar", "imagenet", "plain")


def build_transform(data_cfg, split):
    """torchvision transform for ``split`` ("train" or "val") of the dataset described by data_cfg."""
    kind, size, train = data_cfg.transform, int(data_cfg.image_size), split == "train"
    if kind == "cifar":
        # CenterCrop is a no-op at native 32x32; it lets smaller models (e.g. LeNet at 28) read CIFAR.
        steps = [T.RandomCrop(size, padding=4), T.RandomHorizontalFlip()] if train else [T.CenterCrop(size)]
    elif kind == "imagenet":
        steps = ([T.RandomResizedCrop(size), T.RandomHorizontalFlip()] if train
                 else [T.Resize(round(size / 0.875)), T.CenterCrop(size)])
    elif kind == "plain":
        steps = []
    else:
        raise DataError(f"unknown data.transform={kind!r}; choose one of {', '.join(TRANSFORMS)}.")
    return T.Compose(steps + [T.ToTensor(), T.Normalize(tuple(data_cfg.mean), tuple(data_cfg.std))])
