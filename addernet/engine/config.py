"""Validation of the composed config, and the builders every entry point shares (device, model).

``check_config`` (train.py) and ``check_eval_config`` (test.py) run before anything is built, so a
bad value stops with one message naming the key and the fix instead of failing deep inside.
"""

import math

import torch

from ..checks import choice, number
from ..config.validate import check_schema
from ..data.mix import build_mix
from ..data.transforms import AUTO_AUGMENT
from ..errors import ConfigError
from ..forward import AMP_DTYPES
from ..models import model_from_config
from ..ops import BACKENDS
from ..optim import check_optim, check_sched
from ..tasks import task_class
from .ema import check_ema_decay
from .precise_bn import check_precise_bn
from .trackers import selected

TRAIN_GROUPS = ("model", "data", "optim", "sched", "trainer", "adaptive_lr", "task")
EVAL_GROUPS = ("model", "data", "trainer")


def _groups(cfg, groups, entry):
    for group in groups:
        if not hasattr(cfg.get(group), "get"):
            raise ConfigError(f"config group '{group}' is missing; compose from configs/{entry}.yaml.")


def check_eval_config(cfg):
    """The groups evaluation needs: model, data, trainer (device, amp)."""
    _groups(cfg, EVAL_GROUPS, "test")
    for key in ("batch_size", "num_classes", "in_channels"):
        number(cfg.data, key, f"data.{key}", minimum=1, integer=True)
    if cfg.data.get("num_workers") != "auto":
        number(cfg.data, "num_workers", "data.num_workers (or auto)", integer=True)
    for key in ("mean", "std"):  # Normalize would fail deep inside the data loader instead
        values = cfg.data.get(key)
        if values is not None and len(values) != int(cfg.data.in_channels):
            raise ConfigError(
                f"data.{key} has {len(values)} value(s) but data.in_channels={cfg.data.in_channels}; "
                f"give one per channel, e.g. data.{key}=[{','.join(['0.5'] * int(cfg.data.in_channels))}]."
            )
        ok = (lambda v: v > 0) if key == "std" else (lambda v: True)
        if values is not None and not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and ok(v) for v in values
        ):
            raise ConfigError(
                f"data.{key}={list(values)} must hold finite numbers"
                f"{' > 0 (images are divided by it)' if key == 'std' else ''}"
                f"; e.g. data.{key}=[{','.join(['0.5'] * len(values))}]."
            )
    choice(cfg.trainer, "amp", "trainer.amp", tuple(AMP_DTYPES))
    choice(cfg.model, "layer", "model.layer", ("adder", "conv"))
    device = str(cfg.trainer.device)
    if device not in ("auto", "cpu") and not device.startswith("cuda"):
        raise ConfigError(f"trainer.device={device!r} is not valid; use auto, cpu, cuda or cuda:N.")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"trainer.device={device} but CUDA is not available here; use trainer.device=cpu (or auto).")
    check_input_size(cfg)


def check_config(cfg):
    """Validate everything training uses, with messages that say which override fixes what."""
    _groups(cfg, TRAIN_GROUPS, "train")
    check_schema(cfg, {"task": getattr(task_class(cfg.task.get("name")), "config_keys", ())})
    number(cfg.trainer, "epochs", "trainer.epochs", minimum=1, integer=True)
    for key in ("seed", "log_every", "hist_every"):
        number(cfg.trainer, key, f"trainer.{key}", minimum=0 if key == "seed" else 1, integer=True)
    number(cfg.trainer, "dist_timeout", "trainer.dist_timeout", positive=True)
    if cfg.trainer.seed >= 2**32:  # torch's and the sampler's seeds (seed + rank, seed + epoch) must fit 64 bits
        raise ConfigError(f"trainer.seed={cfg.trainer.seed} is too large; use an integer in [0, 2**32 - 1].")
    check_eval_config(cfg)
    # BatchNorm in training mode needs 2 samples per process and batch (the loader checks the per-process share)
    number(cfg.data, "batch_size", "data.batch_size", minimum=2, integer=True)
    check_optim(cfg.optim)
    check_sched(cfg.sched, int(cfg.trainer.epochs))
    if cfg.adaptive_lr.enabled:
        number(cfg.adaptive_lr, "eta", "adaptive_lr.eta", positive=True)
    if "label_smoothing" in cfg.task and number(cfg.task, "label_smoothing", "task.label_smoothing") >= 1:
        raise ConfigError(
            f"task.label_smoothing must be in [0, 1) (0: off; 0.1 is the usual value), got {cfg.task.label_smoothing}."
        )
    if cfg.trainer.get("clip_grad_norm") is not None:
        number(cfg.trainer, "clip_grad_norm", "trainer.clip_grad_norm (or null: off)", positive=True)
    check_ema_decay(cfg.trainer)
    selected(cfg)  # the logger group's names
    if cfg.data.get("auto_augment") is not None:
        choice(cfg.data, "auto_augment", "data.auto_augment (or null: off)", AUTO_AUGMENT)
    if number(cfg.data, "random_erasing", "data.random_erasing") > 1:
        raise ConfigError(f"data.random_erasing is a probability in [0, 1] (0: off), got {cfg.data.random_erasing}.")
    build_mix(cfg.data)  # the alphas are checked
    augment = [f"data.{k}={cfg.data.get(k)}" for k in ("auto_augment", "random_erasing") if cfg.data.get(k)]
    if cfg.data.get("on_device") and augment:
        raise ConfigError(
            f"data.on_device=true implements the crop and flip of data.transform only, not "
            f"{' '.join(augment)}; use data.on_device=false (the DataLoader path) for that augmentation."
        )
    check_precise_bn(cfg.trainer.get("precise_bn"))
    accumulate = number(cfg.trainer, "accumulate", "trainer.accumulate", minimum=1, integer=True)
    if int(cfg.data.batch_size) < 2 * accumulate:
        raise ConfigError(
            f"trainer.accumulate={accumulate} splits data.batch_size={cfg.data.batch_size} into "
            f"micro-batches of fewer than 2 samples (BatchNorm needs 2); use data.batch_size >= "
            f"{2 * accumulate} or a smaller trainer.accumulate."
        )
    choice(cfg.trainer, "backend", "trainer.backend (or the ADDERNET_BACKEND variable)", tuple(BACKENDS))


def device_type(cfg):
    """Device type, "cuda" or "cpu", from trainer.device (auto: CUDA when present)."""
    device = str(cfg.trainer.device)
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if device.startswith("cuda") else "cpu"


def check_stored_model(cfg, stored, source, keys, fix):
    """ConfigError when cfg.model differs from the model a checkpoint's stored config was trained as.

    An adder checkpoint loaded into its CNN twin (or the reverse) has the same tensor names and shapes,
    so loading succeeds and every prediction is nonsense: the stored config is the only safeguard.
    """
    model = (stored or {}).get("model") or {}
    diff = [
        f"model.{k}={cfg.model.get(k)} (trained as model.{k}={model[k]})"
        for k in keys
        if k in model and model[k] != cfg.model.get(k)
    ]
    if diff:
        raise ConfigError(
            f"{source} was trained as a different model: {'; '.join(diff)}. Its weights would load "
            f"into this model but compute nonsense; {fix}."
        )


def check_input_size(cfg):
    """ConfigError when the model cannot take data.image_size x data.image_size inputs, or does not give one
    logit per class for them (a shapes-only dry run)."""
    size, channels, classes = int(cfg.data.image_size), int(cfg.data.in_channels), int(cfg.data.num_classes)
    with torch.device("meta"):
        model = model_from_config(cfg).eval()
        try:
            out = model(torch.empty(2, channels, size, size))
        except RuntimeError as e:
            raise ConfigError(
                f"model={cfg.model.name} cannot take {channels}x{size}x{size} inputs "
                f"(data.image_size={size}): {str(e).splitlines()[0].rstrip('.')}. Use the model's input size "
                f"(e.g. data.image_size=28 for lenet5_bn) or a model made for this data."
            ) from None
    if isinstance(out, torch.Tensor) and tuple(out.shape) != (2, classes):
        raise ConfigError(
            f"model={cfg.model.name} gives outputs of shape {tuple(out.shape)[1:]} per image for {channels}x{size}x"
            f"{size} inputs (data.image_size={size}), not one logit for each of data.num_classes={classes}; "
            f"use the input size the model is made for or a model made for this data."
        )
