"""Validation of the composed config, and the builders every entry point shares (device, model).

``check_config`` (train.py) and ``check_eval_config`` (test.py) run before anything is built, so a
bad value stops with one message naming the key and the fix instead of failing deep inside.
"""
import torch

from ..checks import choice, number
from ..errors import ConfigError
from ..optim import check_optim, check_sched
from .evaluate import AMP_DTYPES

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
    number(cfg.data, "num_workers", "data.num_workers", integer=True)
    for key in ("mean", "std"):  # Normalize would fail deep inside the data loader instead
        values = cfg.data.get(key)
        if values is not None and len(values) != int(cfg.data.in_channels):
            raise ConfigError(f"data.{key} has {len(values)} value(s) but data.in_channels={cfg.data.in_channels}; "
                              f"give one per channel, e.g. data.{key}=[{','.join(['0.5'] * int(cfg.data.in_channels))}].")
    choice(cfg.trainer, "amp", "trainer.amp", tuple(AMP_DTYPES))
    choice(cfg.model, "layer", "model.layer", ("adder", "conv"))
    device = str(cfg.trainer.device)
    if device not in ("auto", "cpu") and not device.startswith("cuda"):
        raise ConfigError(f"trainer.device={device!r} is not valid; use auto, cpu, cuda or cuda:N.")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"trainer.device={device} but CUDA is not available here; use trainer.device=cpu "
                          f"(or auto).")


def check_config(cfg):
    """Validate everything training uses, with messages that say which override fixes what."""
    _groups(cfg, TRAIN_GROUPS, "train")
    number(cfg.trainer, "epochs", "trainer.epochs", minimum=1, integer=True)
    for key in ("seed", "log_every", "hist_every"):
        number(cfg.trainer, key, f"trainer.{key}", minimum=0 if key == "seed" else 1, integer=True)
    check_eval_config(cfg)
    check_optim(cfg.optim)
    check_sched(cfg.sched, int(cfg.trainer.epochs))
    if cfg.adaptive_lr.enabled:
        number(cfg.adaptive_lr, "eta", "adaptive_lr.eta", positive=True)
    if not isinstance(cfg.trainer.get("compile", False), bool):
        raise ConfigError(f"trainer.compile must be true or false, got {cfg.trainer.compile!r}.")


def device_type(cfg):
    """Device type, "cuda" or "cpu", from trainer.device (auto: CUDA when present)."""
    device = str(cfg.trainer.device)
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if device.startswith("cuda") else "cpu"


def model_from_config(cfg):
    """The model of cfg.model for the dataset of cfg.data (ConfigError on a bad name or form)."""
    from ..models import build_model
    try:
        return build_model(cfg.model.name, layer=cfg.model.layer, num_classes=int(cfg.data.num_classes),
                           in_channels=int(cfg.data.in_channels))
    except (KeyError, ValueError, TypeError) as e:
        msg = e.args[0] if e.args else e
        raise ConfigError(f"cannot build model.name={cfg.model.name!r} (model.layer={cfg.model.layer}): {msg}. "
                          f"Pick a model with model=<name> (configs/model/).") from None
