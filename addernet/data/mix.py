"""data.mixup_alpha / data.cutmix_alpha: batch mixing with torchvision.transforms.v2 MixUp and CutMix.

Applied to each training batch on the device before the forward pass; the targets become mixed one-hot
vectors (N x classes) that cross-entropy takes as class probabilities. With both alphas set, each batch
gets one of the two, chosen at random with equal probability (v2.RandomChoice). Training top-1 of a mixed
batch is counted against the dominant label (the larger of the two weights; ``hard_labels``).
"""

from torchvision.transforms import v2


def build_mix(data_cfg):
    """The batch transform ``(images, labels) -> (mixed images, soft targets)``, or None when both alphas are 0
    (the alphas are checked with the rest of the training config)."""
    mixup, cutmix = float(data_cfg.mixup_alpha), float(data_cfg.cutmix_alpha)
    classes = int(data_cfg.num_classes)
    mixes = ([v2.MixUp(alpha=mixup, num_classes=classes)] if mixup else []) + (
        [v2.CutMix(alpha=cutmix, num_classes=classes)] if cutmix else []
    )
    if not mixes:
        return None
    return mixes[0] if len(mixes) == 1 else v2.RandomChoice(mixes)


def hard_labels(target):
    """Class indices: the dominant label of soft (N x classes) targets, or the targets themselves."""
    return target.argmax(1) if target.dim() == 2 else target
