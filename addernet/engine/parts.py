"""The parts of a training run, built in one phase: ``build(cfg, typed, run_dir, device)`` returns them frozen.

``typed`` is what ``config.check_config`` returned: every rule of the config is checked there, once, and the
parts read its typed values (the schema's dataclasses). What else can refuse the launch runs first (the resume
choice, data, the checkpoint restore and its config comparison, the trackers' packages); only then are the run
dir's files written (config.yaml, run.json, metrics.jsonl, TensorBoard, trackers). So a launch that fails leaves
an existing run dir's files as they were (docs/reliability.md).
"""

import dataclasses
import logging
import os
import random

import torch
import torch.nn as nn
from omegaconf import OmegaConf

from .. import distributed as dist
from ..compile import compile_model
from ..config.schema import Trainer
from ..cuda_graph import CudaGraphed
from ..data import build_dataset, build_loader, check_classes, class_names, num_workers
from ..data.mix import build_mix
from ..models import model_from_config, model_label
from ..ops import kernel_in_use
from ..optim import AdaptiveLR, build_optimizer, build_scheduler
from ..tasks import build_task
from .allocator import retain_freed_memory
from .ema import WeightEMA
from .meters import MetricSums
from .outputs import RunOutputs, write_config, write_facts
from .resume import Progress, restore, resume_path
from .step import Stepper
from .trackers import build_trackers, require_trackers, selected

log = logging.getLogger("addernet.train")


@dataclasses.dataclass(frozen=True)
class Start:
    """Where the loop starts: a fresh Progress, or what a checkpoint gave (resume.Resumed) and its path."""

    progress: Progress
    rng: object = None  # this rank's RNG states of a mid-epoch checkpoint
    path: str = None
    sums: object = None  # the mid-epoch checkpoint's running metric sums


@dataclasses.dataclass(frozen=True)
class Parts:
    """Everything a run uses, built before its first step; nothing here is replaced while it runs."""

    resolved: dict  # the config as plain values (data.num_workers=auto: the number used): config.yaml, checkpoints
    trainer: Trainer  # the typed trainer group (addernet/config/schema.py)
    run_dir: str
    device: torch.device
    world: int
    main: bool
    model: nn.Module
    task: object
    classes: list
    train_loader: object
    val_loader: object
    optimizer: torch.optim.Optimizer
    scheduler: object
    scaler: torch.amp.GradScaler
    adaptive: object
    ema: object
    stepper: Stepper
    start: Start
    hparams: dict  # for the trackers (TensorBoard's hparams, MLflow params, W&B config)
    outputs: RunOutputs

    @property
    def ckpt_dir(self):
        return os.path.join(self.run_dir, "checkpoints")


def build(cfg, typed, run_dir, device):
    """The run's Parts from the checked ``cfg`` and its typed form (check_config's): the resume first, the run
    dir's writes last (rank 0)."""
    trainer, rank, world, main = typed.trainer, dist.get_rank(), dist.get_world_size(), dist.is_main()
    if cfg.data.num_workers == "auto":  # recorded as the number used (it changes the augmentation stream)
        cfg = OmegaConf.merge(cfg, {"data": {"num_workers": num_workers(cfg.data)}})  # a copy
    _seed(trainer.deterministic, trainer.seed + rank)
    if trainer.retain_freed_memory and not retain_freed_memory():
        log.info("trainer.retain_freed_memory: this C library is not glibc; its allocator is left as it is")
    kernel = kernel_in_use(device)
    log.info(
        "run dir %s | %d process(es) | device %s | amp %s | adder backend %s (%s kernel)",
        *(run_dir, world, device, trainer.amp, trainer.backend, kernel),
    )
    path = resume_path(cfg, run_dir, os.path.join(run_dir, "checkpoints"))  # refuses to overwrite a history
    model = _model(cfg, device, trainer)
    task = build_task(model, cfg)
    task.to(device=device, memory_format=trainer.memory_format)  # its own modules (a teacher, a head)
    task.amp = trainer.amp
    classes, train_loader, val_loader = _data(cfg, device, rank, world, trainer.seed)
    optimizer, scheduler, scaler, adaptive, ema, stepper = _optimization(cfg, typed, model, task, device)
    start = Start(Progress())
    if path:  # refuses a different model or settings, before any write
        sums = MetricSums(device)
        resumed = restore(
            path, cfg, model=model, task=task, optimizer=optimizer, scheduler=scheduler, scaler=scaler, sums=sums,
            ema=ema, train_dataset=train_loader.dataset, device=device, world=world, rank=rank,
        )  # fmt: skip
        start, scheduler = Start(Progress(**resumed.state), resumed.rng, path, sums), resumed.scheduler
    if main:
        require_trackers(cfg)  # a missing tracker package is refused before the run dir is written
    resolved, hparams = OmegaConf.to_container(cfg, resolve=True), _hparams(cfg, trainer, world)
    facts = {
        "device": str(device),
        "world_size": world,
        "train_images": len(train_loader.dataset),
        "val_images": len(val_loader.dataset.dataset),
        "data_held_on": str(train_loader.device) if cfg.data.on_device else None,
        "compiled": getattr(model, "_compiled_call_impl", None) is not None,
        "cuda_graph": trainer.cuda_graph,
        "adder_kernel": kernel,
    }
    outputs = _write_outputs(cfg, run_dir, main, start, resolved, hparams, facts)
    return Parts(
        resolved=resolved, trainer=trainer, run_dir=run_dir, device=device, world=world, main=main, model=model,
        task=task, classes=classes, train_loader=train_loader, val_loader=val_loader, optimizer=optimizer,
        scheduler=scheduler, scaler=scaler, adaptive=adaptive, ema=ema, stepper=stepper, start=start,
        hparams=hparams, outputs=outputs,
    )  # fmt: skip


def _seed(deterministic, seed):
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    torch.backends.cudnn.benchmark = not deterministic
    torch.manual_seed(seed)
    random.seed(seed)


def _model(cfg, device, trainer):
    """The model on ``device`` (SyncBatchNorm, torch.compile as configured)."""
    model = model_from_config(cfg)
    if trainer.sync_bn and dist.is_distributed():
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    log.info("model %s: %d parameters", model_label(cfg.model), sum(p.numel() for p in model.parameters()))
    model = model.to(device=device, memory_format=trainer.memory_format)
    return compile_model(model, trainer.compile)


def _data(cfg, device, rank, world, seed):
    """(class names, train loader, val loader); the two splits must name the same classes."""
    train_set, val_set = build_dataset(cfg.data, "train"), build_dataset(cfg.data, "val")
    classes = class_names(train_set)
    check_classes(
        classes,
        val_set,
        f"the training set {getattr(train_set, 'root', '')}".rstrip(),
        "give the train and val folders the same class folder names",
    )
    train_loader, val_loader = (
        build_loader(cfg.data, split, ds, rank=rank, world_size=world, seed=seed, device=device)
        for split, ds in (("train", train_set), ("val", val_set))
    )
    log.info(
        "data %s: %d train / %d val images, global batch %d",
        *(cfg.data.name, len(train_loader.dataset), len(val_loader.dataset.dataset), cfg.data.batch_size),
    )
    return classes, train_loader, val_loader


def _optimization(cfg, typed, model, task, device):
    """(optimizer, schedule, scaler, adaptive LR, weight average, stepper), the model and task DDP-wrapped (or
    CUDA-graphed)."""
    trainer = typed.trainer
    optimizer = build_optimizer(cfg.optim, task.param_groups())
    scheduler = build_scheduler(cfg.sched, optimizer, trainer.epochs)
    scaler = torch.amp.GradScaler(device.type, enabled=trainer.amp == "fp16")
    eta = typed.adaptive_lr.eta
    adaptive = AdaptiveLR(model, eta).attach(optimizer) if typed.adaptive_lr.enabled else None
    if dist.is_distributed():
        ids = [device.index] if device.type == "cuda" else None
        task.distribute(lambda m: nn.parallel.DistributedDataParallel(m, device_ids=ids))
    elif trainer.cuda_graph:  # one process (check_config): the task calls the model through its graphs
        task.distribute(CudaGraphed)
    ema = WeightEMA(model, trainer.ema_decay) if trainer.ema_decay is not None else None
    mix = build_mix(cfg.data)
    stepper = Stepper(task, optimizer, scaler, adaptive, trainer.accumulate, trainer.clip_grad_norm, ema, mix)
    return optimizer, scheduler, scaler, adaptive, ema, stepper


def _write_outputs(cfg, run_dir, main, start, resolved, hparams, facts):
    """config.yaml, run.json and the metrics/TensorBoard/tracker outputs (rank 0): the launch's first writes."""
    if main:
        write_config(run_dir, cfg)
        write_facts(run_dir, facts)
    outputs = RunOutputs(
        run_dir,
        main,
        start.progress.epoch if start.path else None,
        tensorboard="tensorboard" in selected(cfg),
        trackers=build_trackers(cfg, run_dir, resolved, hparams) if main else (),
    )
    outputs.rewrite_metrics(start.progress.history)
    return outputs


def _hparams(cfg, trainer, world):
    return {
        "model": cfg.model.name,
        "layer": cfg.model.layer,
        "data": cfg.data.name,
        "task": cfg.task.name,
        "epochs": trainer.epochs,
        "batch_size": cfg.data.batch_size,
        "lr": float(cfg.optim.lr),
        "weight_decay": float(cfg.optim.weight_decay),
        "adaptive_lr": cfg.adaptive_lr.enabled,
        "eta": float(cfg.adaptive_lr.eta),
        "amp": trainer.amp,
        "seed": trainer.seed,
        "world_size": world,
    }
