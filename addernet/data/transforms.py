"""The paper's input pipelines, chosen by ``data.transform``.

cifar:    RandomCrop(size, padding=4) + horizontal flip for training (the AdderNet/ResNet CIFAR recipe),
          CenterCrop(size) for validation (a no-op at CIFAR's native 32x32).
imagenet: RandomResizedCrop(size) + flip for training; Resize(size/0.875) + CenterCrop(size) for
          validation (the standard torchvision ImageNet recipe, 256 -> 224).
plain:    no augmentation (MNIST, FakeData).
Every pipeline ends with ToTensor + Normalize(data.mean, data.std).

Optional training augmentation (off by default), torchvision's own transforms:
data.auto_augment: randaugment (RandAugment), trivialaugment (TrivialAugmentWide) or autoaugment (AutoAugment,
the CIFAR-10 policy, or the ImageNet policy with data.transform=imagenet), after the crop and flip;
data.random_erasing=p: RandomErasing(p) on the normalised tensor (erased pixels become 0, the mean).
"""

from torchvision import transforms as T

from ..errors import DataError

TRANSFORMS = ("cifar", "imagenet", "plain")
AUTO_AUGMENT = ("randaugment", "trivialaugment", "autoaugment")


def auto_augment(data_cfg):
    """The data.auto_augment transform (None when off)."""
    name = data_cfg.auto_augment
    if name is None:
        return None
    if name not in AUTO_AUGMENT:
        raise DataError(f"unknown data.auto_augment={name!r}; choose null (off) or one of {', '.join(AUTO_AUGMENT)}.")
    if name == "randaugment":
        return T.RandAugment()
    if name == "trivialaugment":
        return T.TrivialAugmentWide()
    policy = T.AutoAugmentPolicy.IMAGENET if data_cfg.transform == "imagenet" else T.AutoAugmentPolicy.CIFAR10
    return T.AutoAugment(policy)


def build_transform(data_cfg, split):
    """torchvision transform for ``split`` ("train" or "val") of the dataset described by data_cfg."""
    kind, size, train = data_cfg.transform, int(data_cfg.image_size), split == "train"
    if kind == "cifar":
        # CenterCrop is a no-op at native 32x32; it lets smaller models (e.g. LeNet at 28) read CIFAR.
        steps = [T.RandomCrop(size, padding=4), T.RandomHorizontalFlip()] if train else [T.CenterCrop(size)]
    elif kind == "imagenet":
        steps = (
            [T.RandomResizedCrop(size), T.RandomHorizontalFlip()]
            if train
            else [T.Resize(round(size / 0.875)), T.CenterCrop(size)]
        )
    elif kind == "plain":
        steps = []
    else:
        raise DataError(f"unknown data.transform={kind!r}; choose one of {', '.join(TRANSFORMS)}.")
    extra = auto_augment(data_cfg) if train else None
    erasing = float(data_cfg.random_erasing) if train else 0.0
    if not 0 <= erasing <= 1:
        raise DataError(f"data.random_erasing is the probability of erasing a rectangle, in [0, 1]; got {erasing}.")
    return T.Compose(
        steps
        + ([extra] if extra else [])
        + [T.ToTensor(), T.Normalize(tuple(data_cfg.mean), tuple(data_cfg.std))]
        + ([T.RandomErasing(p=erasing)] if erasing else [])
    )
