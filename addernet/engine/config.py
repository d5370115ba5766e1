"""Validation of the composed config, and the builders every entry point shares (device, model).

``check_config`` (train.py) and ``check_eval_config`` (test.py) run before anything is built, so a
bad value stops with one message naming the key and the fix instead of failing deep inside. The rules
of a training config, those between keys included, are checked there: ``check_config`` returns the typed,
frozen ``Settings`` the run reads. A training task's own rules on its ``task.*`` keys are checked when
``build_task`` builds the task (``TrainingTask.check_config``); ``compile_model`` and ``autocast`` check
their own argument (``trainer.compile``, ``trainer.amp``) again for callers outside the engine.
"""

import dataclasses
import math
from typing import Optional

import torch

from .. import distributed as dist
from ..checks import choice, number
from ..config.validate import check_schema
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
    """The groups evaluation needs: model, data, trainer (device, amp); returns the model cfg builds, on the meta
    device (its shapes checked against the data)."""
    _groups(cfg, EVAL_GROUPS, "test")
    for key in ("batch_size", "num_classes", "in_channels"):
        number(cfg.data, key, f"data.{key}", minimum=1, integer=True)
    if cfg.data.num_workers != "auto":
        number(cfg.data, "num_workers", "data.num_workers (or auto)", integer=True)
    for key in ("mean", "std"):  # Normalize would fail deep inside the data loader instead
        values = cfg.data[key]
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
    return check_input_size(cfg)


@dataclasses.dataclass(frozen=True)
class Settings:
    """The values a training run reads, checked together by ``check_config`` and typed once."""

    seed: int
    epochs: int
    device: str  # auto | cpu | cuda | cuda:N
    amp: str  # off | bf16 | fp16
    channels_last: bool
    backend: str  # the adder kernels: fast | eager | reference
    compile: bool
    deterministic: bool
    sync_bn: bool
    dist_timeout: float  # seconds
    log_every: int
    hist_every: int
    progress: bool
    accumulate: int  # micro-batches per optimizer step
    clip_grad_norm: Optional[float]  # None: off
    ema_decay: Optional[float]  # None: off
    precise_bn: int  # 0: off
    adaptive_eta: Optional[float]  # None: the adaptive learning rate is off
    batch_size: int  # the global batch

    @property
    def memory_format(self):
        return torch.channels_last if self.channels_last else torch.contiguous_format


def check_config(cfg, world=None):
    """Check the rules of a training config, cross-field ones included; returns its typed Settings. The task's
    own rules on its ``task.*`` keys run when the task is built (``build_task``).

    ``world``: the number of processes (default: what torchrun or SLURM announced), for the rules on each
    process's share of the batch. The messages say which override fixes what.
    """
    _groups(cfg, TRAIN_GROUPS, "train")
    check_schema(cfg, {"task": getattr(task_class(cfg.task.name), "config_keys", ())})
    trainer = _trainer(cfg.trainer)
    model = check_eval_config(cfg)
    batch_size = _train_data(cfg.data)
    check_optim(cfg.optim)
    check_sched(cfg.sched, trainer["epochs"])
    if cfg.adaptive_lr.enabled:
        number(cfg.adaptive_lr, "eta", "adaptive_lr.eta", positive=True)
    if "label_smoothing" in cfg.task and number(cfg.task, "label_smoothing", "task.label_smoothing") >= 1:
        raise ConfigError(
            f"task.label_smoothing must be in [0, 1) (0: off; 0.1 is the usual value), got {cfg.task.label_smoothing}."
        )
    selected(cfg)  # the logger group's names
    check_precise_bn(trainer["precise_bn"], model, f"model={cfg.model.name}")
    world = dist.env_world_size() if world is None else int(world)
    check_accumulate(trainer["accumulate"], batch_size, world)
    if trainer["sync_bn"] and world > 1 and device_type(cfg) == "cpu":
        raise ConfigError(
            "trainer.sync_bn=true needs CUDA (torch's SyncBatchNorm does not run on CPU); "
            "use trainer.sync_bn=false for CPU runs."
        )
    eta = float(cfg.adaptive_lr.eta) if cfg.adaptive_lr.enabled else None
    return Settings(**trainer, adaptive_eta=eta, batch_size=batch_size)


def _trainer(t):
    """The trainer group's values, each checked and typed (trainer.amp and trainer.device: check_eval_config)."""
    seed = number(t, "seed", "trainer.seed", integer=True)
    if seed >= 2**32:  # torch's and the sampler's seeds (seed + rank, seed + epoch) must fit 64 bits
        raise ConfigError(f"trainer.seed={seed} is too large; use an integer in [0, 2**32 - 1].")
    clip = t.clip_grad_norm
    if clip is not None:
        clip = float(number(t, "clip_grad_norm", "trainer.clip_grad_norm (or null: off)", positive=True))
    return dict(
        seed=seed,
        epochs=number(t, "epochs", "trainer.epochs", minimum=1, integer=True),
        log_every=number(t, "log_every", "trainer.log_every", minimum=1, integer=True),
        hist_every=number(t, "hist_every", "trainer.hist_every", minimum=1, integer=True),
        dist_timeout=float(number(t, "dist_timeout", "trainer.dist_timeout", positive=True)),
        clip_grad_norm=clip,
        ema_decay=check_ema_decay(t),
        precise_bn=check_precise_bn(t.precise_bn),
        accumulate=number(t, "accumulate", "trainer.accumulate", minimum=1, integer=True),
        backend=choice(t, "backend", "trainer.backend (or the ADDERNET_BACKEND variable)", tuple(BACKENDS)),
        device=str(t.device),
        amp=str(t.amp),
        **{k: bool(t[k]) for k in ("channels_last", "compile", "deterministic", "sync_bn", "progress")},
    )


def _train_data(d):
    """The data group's training rules (augmentation, mixing, on-device data); returns data.batch_size."""
    # BatchNorm in training mode needs 2 samples per process and batch (the loader checks the per-process share)
    batch_size = number(d, "batch_size", "data.batch_size", minimum=2, integer=True)
    if d.auto_augment is not None:
        choice(d, "auto_augment", "data.auto_augment (or null: off)", AUTO_AUGMENT)
    if number(d, "random_erasing", "data.random_erasing") > 1:
        raise ConfigError(f"data.random_erasing is a probability in [0, 1] (0: off), got {d.random_erasing}.")
    for key in ("mixup_alpha", "cutmix_alpha"):
        number(d, key, f"data.{key} (0: off)")
    augment = [f"data.{k}={d[k]}" for k in ("auto_augment", "random_erasing") if d[k]]
    if d.on_device and augment:
        raise ConfigError(
            f"data.on_device=true implements the crop and flip of data.transform only, not "
            f"{' '.join(augment)}; use data.on_device=false (the DataLoader path) for that augmentation."
        )
    return batch_size


def check_accumulate(accumulate, batch_size, world):
    """ConfigError when trainer.accumulate splits a process's share of the batch into micro-batches below 2."""
    share = batch_size // world
    if share >= 2 * accumulate:
        return
    if world == 1:
        raise ConfigError(
            f"trainer.accumulate={accumulate} splits data.batch_size={batch_size} into "
            f"micro-batches of fewer than 2 samples (BatchNorm needs 2); use data.batch_size >= "
            f"{2 * accumulate} or a smaller trainer.accumulate."
        )
    raise ConfigError(
        f"trainer.accumulate={accumulate} splits each process's batch of {share} into micro-batches "
        f"of fewer than 2 samples (BatchNorm needs 2); use data.batch_size >= {2 * accumulate * world} "
        f"({world} processes) or a smaller trainer.accumulate."
    )


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
        f"model.{k}={cfg.model[k]} (trained as model.{k}={model[k]})"
        for k in keys
        if k in model and model[k] != cfg.model[k]
    ]
    if diff:
        raise ConfigError(
            f"{source} was trained as a different model: {'; '.join(diff)}. Its weights would load "
            f"into this model but compute nonsense; {fix}."
        )


def check_input_size(cfg):
    """ConfigError when the model cannot take data.image_size x data.image_size inputs, or does not give one
    logit per class for them (a shapes-only dry run); returns the model, on the meta device."""
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
    return model
