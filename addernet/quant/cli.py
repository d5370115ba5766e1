"""The entry points' side of quantisation: test.py, scripts/quantize.py and scripts/export_onnx.py call these.

Calibration images: a seeded random subset of quant.calib_images images of the data config's
*training* split, in a fixed random order (an ImageFolder is sorted by class; class-sorted batches
would bias the BatchNorm estimates). The random augmentation of image i is seeded by (quant.seed, i)
(SeededSubset), so the calibrated model is the same whatever data.num_workers, the process that loads
an image, or the order of the batches. The activation ranges are taken with the *validation*
transform (no augmentation, ours; quant.calib_augment=true for the code's augmented batches);
BatchNorm is re-estimated on the same images *with* the training augmentation
(quant.bn_augment=true, as the code): measured on the official ResNet-20, re-estimating it on
un-augmented images costs about 2 points at 8 bits (docs/quantization.md).
"""

import logging

import torch
from omegaconf import OmegaConf
from torch.utils.data import Subset

from ..data import DataError, build_dataset, build_loader, build_transform
from ..errors import ConfigError
from .convert import check_quant_config, quant_summary, quantize_model

log = logging.getLogger("addernet.quant")

SETTINGS = (
    "bits",
    "groups",
    "grouping",
    "calib_images",
    "calib_augment",
    "act_range",
    "act_quantile",
    "weight_grid",
    "bn_recalib",
    "bn_method",
    "bn_augment",
    "bn_momentum",
    "seed",
)


class SeededSubset(Subset):
    """``Subset(dataset, indices)`` whose item j is transformed under torch's RNG seeded by (seed, indices[j]):
    a random augmentation then depends on the image and the seed only, not on the loader worker that reads it
    (each worker has its own random stream) or on what was read before. The caller's RNG state is kept."""

    def __init__(self, dataset, indices, seed):
        super().__init__(dataset, indices)
        self.seed = int(seed)

    def __getitem__(self, j):
        with torch.random.fork_rng(devices=[]):
            # the CPU generator alone (torch.manual_seed also queues a seed for every accelerator, at a cost)
            torch.random.default_generator.manual_seed((self.seed * 1_000_003 + int(self.indices[j])) % 2**63)
            return self.dataset[self.indices[j]]

    def __getitems__(self, js):  # the DataLoader's batched fetch: the same per-image seeding
        return [self[j] for j in js]


def calibration_loader(cfg, augment=None, quiet=False):
    """Loader over the calibration images of cfg.data's training split (see the module docstring);
    with the training augmentation when `augment` (default: quant.calib_augment). Asking for more images
    than the split holds is a one-line warning naming the count used (unless ``quiet``: a second loader
    over the same images)."""
    q = cfg.quant
    try:
        dataset = build_dataset(cfg.data, "train")
    except DataError as e:
        raise ConfigError(
            f"quant.bits={q.bits} calibrates on the training split of data={cfg.data.name}, which "
            f"cannot be loaded: {e} Point data.root (or data.train_dir) at it, or evaluate a quantised "
            f"checkpoint written by scripts/quantize.py."
        ) from None
    if len(dataset) == 0:
        raise ConfigError(
            f"quant.bits={q.bits}: the training split of data={cfg.data.name} is empty; nothing to calibrate on."
        )
    if not (q.calib_augment if augment is None else augment):
        dataset.transform = build_transform(cfg.data, "val")
    n, batch = min(int(q.calib_images), len(dataset)), int(q.calib_batch_size)
    if int(q.calib_images) > len(dataset) and not quiet:
        used = n - (n % batch == 1 and n > 1)
        log.warning(
            "quant.calib_images=%d is more than the %d images of the training split of data=%s: calibrating on %d",
            q.calib_images,
            len(dataset),
            cfg.data.name,
            used,
        )
    if q.bn_recalib and (n == 1 or batch == 1):
        raise ConfigError(
            f"quant.calib_images={q.calib_images} and quant.calib_batch_size={batch} (training split: "
            f"{len(dataset)} images): the BatchNorm re-estimation (quant.bn_recalib=true) needs "
            f"batches of at least 2 images; use at least 2 of each, or quant.bn_recalib=false."
        )
    if n % batch == 1:
        n -= 1  # a last batch of one image: BatchNorm in training mode cannot use it, so it is left out
    pick = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(int(q.seed)))[:n]
    data_cfg = OmegaConf.merge(cfg.data, {"batch_size": int(q.calib_batch_size), "pin_memory": False})
    # random order: batches mix classes; augmentation seeded per image
    return build_loader(data_cfg, "val", SeededSubset(dataset, pick.tolist(), q.seed))


def settings(cfg, n_images):
    out = {k: OmegaConf.to_container(cfg.quant, resolve=True).get(k) for k in SETTINGS}
    out["calib_images"] = n_images
    return out


def quantize_for_eval(model, cfg, device=None):
    """(model, quant info for the JSON result or None). Quantises the float `model` when quant.bits is set.

    A model already holding quantised layers (loaded from a quantised checkpoint) is returned as is:
    it is not calibrated again; asking for other bits or groups then is an error.
    """
    q = cfg.quant
    floor = float(q.act_range_floor)
    stored = quant_summary(model, floor)
    if stored is not None:
        asked = {k: q[k] for k in ("bits", "groups")} if q.bits is not None else {}
        for key, want in asked.items():
            if want != stored[key]:
                raise ConfigError(
                    f"the checkpoint is already quantised with {key}={stored[key]}, but quant.{key}="
                    f"{want} was asked; drop the quant.* overrides or pass the float checkpoint."
                )
        return model, {**stored, "calibrated": "stored in the checkpoint"}
    if q.bits is None:
        if q.runtime != "auto":
            raise ConfigError(
                f"quant.runtime={q.runtime} applies to quantised models, and this one is float: set quant.bits "
                "(e.g. quant.bits=8) or evaluate a quantised checkpoint; drop quant.runtime for the float model."
            )
        return model, None
    check_quant_config(q)
    loader = calibration_loader(cfg)
    reestimate = q.bn_recalib and q.bn_method == "reestimate"
    bn_loader = calibration_loader(cfg, augment=bool(q.bn_augment), quiet=True) if reestimate else None
    progress = bool(cfg.trainer.progress)
    quantize_model(model, loader, q, bn_loader, progress=progress)
    info = {**settings(cfg, len(loader.dataset)), "floored_layers": quant_summary(model, floor)["floored_layers"]}
    return model, {**info, "calibrated": "now"}
