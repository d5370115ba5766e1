"""The checks of a composed config, run once before anything is built, and the builders every entry point shares.

``check_config`` (train.py) and ``check_eval_config`` (test.py) stop a bad value with one message naming the
key and the fix instead of a failure deep inside. A value's own rule sits with its field in the schema
(addernet/config/schema.py, each class's ``__post_init__``, run by ``OmegaConf.to_object``); here, once, are
the rules that need more than one group or what the process sees: the names each registry knows (optimizer,
schedule, adder kernels, augmentation, loggers, the task), the device, the model against the data, the
training rules on the batch, and the task's own rules (``TrainingTask.check_config``).
"""

import torch

from .. import distributed as dist
from ..checks import choice, number
from ..config.schema import Data, Model, Trainer
from ..config.validate import as_schema, check_schema
from ..data import check_data_values
from ..data.transforms import AUTO_AUGMENT
from ..errors import AdderNetError, ConfigError
from ..models import MODELS, NATIVE_DATA, model_from_config
from ..ops import BACKENDS
from ..optim import OPTIMIZERS, SCHEDULERS, check_name
from ..tasks import Student, task_class
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
    for group, schema in (("data", Data), ("model", Model), ("trainer", Trainer)):
        as_schema(cfg[group], schema, group)  # the values' own rules (a checkpoint's stored group has no schema)
    check_data_values(cfg.data)
    _check_device(str(cfg.trainer.device))
    return check_input_size(cfg)


def _check_device(device):
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"trainer.device={device} but CUDA is not available here; use trainer.device=cpu (or auto).")


def check_config(cfg, world=None):
    """Check a training config once: every value (the schema's classes), every name a registry resolves, every
    rule between keys, the task's own included. Returns the typed config (``OmegaConf.to_object``: the schema's
    dataclasses), which the run reads.

    ``world``: the number of processes (default: what torchrun or SLURM announced), for the rules on each
    process's share of the batch. The messages say which override fixes what.
    """
    _groups(cfg, TRAIN_GROUPS, "train")
    task = task_class(cfg.task.name)
    check_schema(cfg, {"task": getattr(task, "config_keys", ())})
    typed = as_schema(cfg, None, "")  # every value's own rule
    check_data_values(cfg.data)
    _check_names(cfg)
    _check_device(typed.trainer.device)
    model = check_input_size(cfg)
    trainer, batch_size = typed.trainer, typed.data.batch_size
    # BatchNorm in training mode needs 2 samples per process and batch (the loader checks the per-process share)
    number(cfg.data, "batch_size", "data.batch_size", minimum=2, integer=True)
    if "warmup_epochs" in cfg.sched and typed.sched.warmup_epochs >= trainer.epochs:
        raise ConfigError(
            f"sched.warmup_epochs={typed.sched.warmup_epochs} must be below trainer.epochs={trainer.epochs}."
        )
    check_precise_bn(trainer.precise_bn, model, f"model={cfg.model.name}")
    world = dist.env_world_size() if world is None else int(world)
    check_accumulate(trainer.accumulate, batch_size, world)
    if trainer.sync_bn and world > 1 and device_type(cfg) == "cpu":
        raise ConfigError(
            "trainer.sync_bn=true needs CUDA (torch's SyncBatchNorm does not run on CPU); "
            "use trainer.sync_bn=false for CPU runs."
        )
    if trainer.cuda_graph:
        check_cuda_graph(cfg, world)
    task.check_config(cfg.task, Student.from_config(cfg))
    return typed


def check_cuda_graph(cfg, world):
    """trainer.cuda_graph's rules: one CUDA process, not compiled, one backward per step (addernet/cuda_graph.py)."""
    off = "or set trainer.cuda_graph=false"
    if device_type(cfg) != "cuda":
        raise ConfigError(f"trainer.cuda_graph=true needs a CUDA device (trainer.device=cuda) {off}.")
    if world > 1:
        raise ConfigError(f"trainer.cuda_graph=true runs in one process, not under torchrun ({world}); {off}.")
    if cfg.trainer.compile:
        raise ConfigError(f"trainer.cuda_graph=true and trainer.compile=true do not combine; keep one {off}.")
    if cfg.trainer.accumulate > 1:  # a replay rewrites the gradient memory the previous micro-batch left in .grad
        raise ConfigError(
            f"trainer.cuda_graph=true needs trainer.accumulate=1 (got {cfg.trainer.accumulate}): a replayed backward "
            f"reuses the memory of the previous micro-batch's gradients; use a smaller data.batch_size {off}."
        )


def _check_names(cfg):
    """The names a registry resolves: optimizer, schedule, adder kernels, augmentation, loggers."""
    check_name(cfg.optim, "optim", OPTIMIZERS)
    check_name(cfg.sched, "sched", SCHEDULERS)
    choice(cfg.trainer, "backend", "trainer.backend (or the ADDERNET_BACKEND variable)", tuple(BACKENDS))
    if cfg.data.auto_augment is not None:
        choice(cfg.data, "auto_augment", "data.auto_augment (or null: off)", AUTO_AUGMENT)
    selected(cfg)


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


def _logits(model, channels, size):
    """The model's output for a batch of 2 images of ``channels`` x ``size`` x ``size`` (on the meta device)."""
    with torch.device("meta"):
        return model(torch.empty(2, channels, size, size))


def _made_for(cfg, model, channels, classes):
    """What to use instead: the input size the model is made for (its dataset's, or model.image_size), when a dry
    run at that size gives one logit per class, else a general hint."""
    family = MODELS.get(cfg.model.name, (None, None))[1]
    sizes = [NATIVE_DATA[family][1]] if family in NATIVE_DATA else []
    sizes += [cfg.model.image_size] if isinstance(cfg.model.get("image_size"), int) else []
    for size in sizes:
        try:
            out = _logits(model, channels, size)
        except (AdderNetError, RuntimeError, ValueError):
            continue
        if isinstance(out, torch.Tensor) and tuple(out.shape) == (2, classes):
            return (
                f"model={cfg.model.name} takes {channels}x{size}x{size} inputs: use data.image_size={size} "
                f"(with images of that size), or a model made for this data."
            )
    return "Use the input size the model is made for, or a model made for this data."


def check_input_size(cfg):
    """ConfigError when the model cannot take data.image_size x data.image_size inputs, or does not give one
    logit per class for them (a shapes-only dry run); returns the model, on the meta device."""
    size, channels, classes = int(cfg.data.image_size), int(cfg.data.in_channels), int(cfg.data.num_classes)
    with torch.device("meta"):
        model = model_from_config(cfg).eval()
    try:
        out = _logits(model, channels, size)
    except AdderNetError:
        raise  # the model's own one-line message (model=vit built for another size)
    except (RuntimeError, ValueError) as e:  # torch's shape errors, and the adder layers' own
        raise ConfigError(
            f"model={cfg.model.name} cannot take {channels}x{size}x{size} inputs (data.image_size={size}): "
            f"{str(e).splitlines()[0].rstrip('.')}. {_made_for(cfg, model, channels, classes)}"
        ) from None
    if isinstance(out, torch.Tensor) and tuple(out.shape) != (2, classes):
        raise ConfigError(
            f"model={cfg.model.name} gives outputs of shape {tuple(out.shape)[1:]} per image for {channels}x{size}x"
            f"{size} inputs (data.image_size={size}), not one logit for each of data.num_classes={classes}. "
            f"{_made_for(cfg, model, channels, classes)}"
        )
    return model
