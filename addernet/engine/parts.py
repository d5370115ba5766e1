"""The parts of a training run, built in one phase: ``build(cfg, settings, run_dir, device)`` returns them frozen.

``settings`` is what ``config.check_config`` returned, and the parts read its typed values; the task checks
its own ``task.*`` keys as ``build_task`` builds it. What else can refuse the launch runs first (the resume
choice, data, the checkpoint restore and its config comparison, the trackers' packages); only then are the run
dir's files written (config.yaml, run.json, metrics.jsonl, TensorBoard, trackers). So a launch that fails leaves an
existing run dir's files as they were (docs/reliability.md).
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
from ..data import build_dataset, build_loader, check_classes, class_names, num_workers
from ..data.mix import build_mix
from ..models import model_from_config, model_label
from ..ops import kernel_in_use
from ..optim import AdaptiveLR, build_optimizer, build_scheduler
from ..tasks import build_task
from .config import Settings
from .ema import WeightEMA
from .meters import MetricSums
from .outputs import RunOutputs, write_config, write_facts
from .resume import fresh_state, restore, resume_path
from .step import Stepper
from .trackers import build_trackers, require_trackers, selected

log = logging.getLogger("addernet.train")


@dataclasses.dataclass(frozen=True)
class Start:
    """Where the loop starts: a fresh state, or what a checkpoint gave (resume.Resumed) and its path."""

    state: dict
    rng: object = None  # this rank's RNG states of a mid-epoch checkpoint
    path: str = None
    sums: object = None  # the mid-epoch checkpoint's running metric sums


@dataclasses.dataclass(frozen=True)
class Parts:
    """Everything a run uses, built before its first step; nothing here is replaced while it runs."""

    cfg: object  # the composed config, data.num_workers=auto replaced by the number used
    resolved: dict  # cfg as plain values: what config.yaml and every checkpoint record
    settings: Settings
    run_dir: str
    device: torch.device
    rank: int
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


def build(cfg, settings, run_dir, device):
    """The run's Parts from the checked ``cfg`` and its Settings: the resume first, the run dir's writes last
    (rank 0)."""
    if cfg.data.num_workers == "auto":  # recorded as the number used (it changes the augmentation stream)
        cfg = OmegaConf.merge(cfg, {"data": {"num_workers": num_workers(cfg.data)}})  # a copy
    rank, world = dist.get_rank(), dist.get_world_size()
    _seed(settings.deterministic, settings.seed + rank)
    kernel = kernel_in_use(device)
    log.info(
        "run dir %s | %d process(es) | device %s | amp %s | adder backend %s (%s kernel)",
        *(run_dir, world, device, settings.amp, settings.backend, kernel),
    )
    path = resume_path(cfg, run_dir, os.path.join(run_dir, "checkpoints"))  # refuses to overwrite a history
    model = _model(cfg, device, settings)
    task = build_task(model, cfg)
    task.to(device=device, memory_format=settings.memory_format)  # its own modules (a teacher, a head)
    task.amp = settings.amp
    classes, train_loader, val_loader = _data(cfg, device, rank, world, settings.seed)
    optimizer = build_optimizer(cfg.optim, task.param_groups())
    parts = dict(
        cfg=cfg,
        resolved=OmegaConf.to_container(cfg, resolve=True),
        settings=settings,
        run_dir=run_dir,
        device=device,
        rank=rank,
        world=world,
        main=dist.is_main(),
        model=model,
        task=task,
        classes=classes,
        train_loader=train_loader,
        val_loader=val_loader,
        **_optimization(cfg, model, task, optimizer, device, settings),
    )
    parts["start"], parts["scheduler"] = _start(path, parts)  # refuses a different model, before any write
    if parts["main"]:
        require_trackers(cfg)  # a missing tracker package is refused before the run dir is written
    parts["hparams"] = _hparams(parts)
    parts["outputs"] = _write_outputs(parts, kernel)
    return Parts(**parts)


def _seed(deterministic, seed):
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    torch.backends.cudnn.benchmark = not deterministic
    torch.manual_seed(seed)
    random.seed(seed)


def _model(cfg, device, settings):
    """The model on ``device`` (SyncBatchNorm, torch.compile as configured)."""
    model = model_from_config(cfg)
    if settings.sync_bn and dist.is_distributed():
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    log.info("model %s: %d parameters", model_label(cfg.model), sum(p.numel() for p in model.parameters()))
    model = model.to(device=device, memory_format=settings.memory_format)
    return compile_model(model, settings.compile)


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


def _optimization(cfg, model, task, optimizer, device, settings):
    """Schedule, scaler, adaptive LR, DDP wrapping, weight average and the stepper, as a dict of Parts fields."""
    scheduler = build_scheduler(cfg.sched, optimizer, settings.epochs)
    scaler = torch.amp.GradScaler(device.type, enabled=settings.amp == "fp16")
    eta = settings.adaptive_eta
    adaptive = AdaptiveLR(model, eta).attach(optimizer) if eta is not None else None
    if dist.is_distributed():
        ids = [device.index] if device.type == "cuda" else None
        task.distribute(lambda m: nn.parallel.DistributedDataParallel(m, device_ids=ids))
    ema = WeightEMA(model, settings.ema_decay) if settings.ema_decay is not None else None
    mix = build_mix(cfg.data)
    stepper = Stepper(task, optimizer, scaler, adaptive, settings.accumulate, settings.clip_grad_norm, ema, mix)
    return dict(optimizer=optimizer, scheduler=scheduler, scaler=scaler, adaptive=adaptive, ema=ema, stepper=stepper)


def _start(path, p):
    """(Start, the schedule to run with): the checkpoint at ``path`` restored into the parts, or a fresh start."""
    if not path:
        return Start(fresh_state()), p["scheduler"]
    names = ("model", "task", "optimizer", "scheduler", "scaler", "ema", "device", "world", "rank")
    sums = MetricSums(p["device"])
    resumed = restore(path, p["cfg"], sums=sums, train_dataset=p["train_loader"].dataset, **{k: p[k] for k in names})
    return Start(resumed.state, resumed.rng, path, sums), resumed.scheduler


def _write_outputs(p, kernel):
    """config.yaml, run.json and the metrics/TensorBoard/tracker outputs (rank 0): the launch's first writes."""
    run_dir, main, cfg, start = p["run_dir"], p["main"], p["cfg"], p["start"]
    if main:
        write_config(run_dir, cfg)
        write_facts(
            run_dir,
            {
                "device": str(p["device"]),
                "world_size": p["world"],
                "train_images": len(p["train_loader"].dataset),
                "val_images": len(p["val_loader"].dataset.dataset),
                "data_held_on": str(p["train_loader"].device) if cfg.data.on_device else None,
                "compiled": getattr(p["model"], "_compiled_call_impl", None) is not None,
                "adder_kernel": kernel,
            },
        )
    outputs = RunOutputs(
        run_dir,
        main,
        start.state["epoch"] if start.path else None,
        tensorboard="tensorboard" in selected(cfg),
        trackers=build_trackers(cfg, run_dir, p["resolved"], p["hparams"]) if main else (),
    )
    outputs.rewrite_metrics(start.state["history"])
    return outputs


def _hparams(p):
    cfg, s = p["cfg"], p["settings"]
    return {
        "model": cfg.model.name,
        "layer": cfg.model.layer,
        "data": cfg.data.name,
        "task": cfg.task.name,
        "epochs": s.epochs,
        "batch_size": s.batch_size,
        "lr": float(cfg.optim.lr),
        "weight_decay": float(cfg.optim.weight_decay),
        "adaptive_lr": s.adaptive_eta is not None,
        "eta": float(cfg.adaptive_lr.eta),
        "amp": s.amp,
        "seed": s.seed,
        "world_size": p["world"],
    }
