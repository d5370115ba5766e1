"""The training loop: one plain loop, features switched by flags (timm style), never by branches.

``train(cfg, run_dir)`` builds everything from the resolved Hydra config and trains. Reproducibility
and resume rest on one rule: every epoch's randomness is a pure function of (seed, epoch, rank)
(see addernet.data.seed_epoch) and ``checkpoints/last.pt`` is written atomically at every epoch end.
A run killed at any moment therefore resumes by replaying the interrupted epoch, and with
trainer.deterministic=true on CPU ends with exactly the metrics of an uninterrupted run. SIGTERM
(pre-emption) finishes the current step and saves a mid-epoch last.pt holding the step count and
RNG states; resuming fast-forwards the epoch's data iterator to that step (loading, not training).
"""
import json
import logging
import math
import os
import random
import signal
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from omegaconf import OmegaConf
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from .. import distributed as dist
from ..checkpoint import CheckpointError, load_checkpoint, load_weights, save_checkpoint
from ..data import build_dataset, build_loader, seed_epoch
from ..ops import Adder2d
from ..optim import AdaptiveLR
from .evaluate import AMP_DTYPES, autocast, evaluate
from .meters import MetricSums

log = logging.getLogger("addernet.train")
FORMAT_VERSION = 1


class ConfigError(ValueError):
    """A config value is invalid; the message names the key and the fix."""


class Preempted(RuntimeError):
    """SIGTERM arrived: last.pt was saved after the current step; the run exits non-zero."""


class NonFiniteLoss(RuntimeError):
    """The loss became NaN/inf; the last good checkpoint is left untouched."""


# --------------------------------------------------------------------------------------- config

def _int(cfg, key, minimum):
    value = OmegaConf.select(cfg, key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key} must be an integer >= {minimum}, got {value!r}; e.g. {key}={max(minimum, 1)}.")
    return value


def _num(cfg, key, positive=False):
    value = OmegaConf.select(cfg, key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (positive and value == 0):
        raise ConfigError(f"{key} must be a {'positive' if positive else 'non-negative'} number, got {value!r}.")
    return float(value)


def _choice(cfg, key, choices):
    value = OmegaConf.select(cfg, key)
    if value is False and "off" in choices:  # YAML/CLI may turn a bare off into false
        value = "off"
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not valid; choose one of: {', '.join(map(str, choices))}.")
    return value


def check_config(cfg):
    """Validate the keys the loop uses, with messages that say which override fixes what."""
    for group in ("model", "data", "optim", "sched", "trainer", "adaptive_lr"):
        if not isinstance(cfg.get(group), (dict, type(cfg))):
            raise ConfigError(f"config group '{group}' is missing; compose from configs/train.yaml.")
    _int(cfg, "trainer.epochs", 1)
    _int(cfg, "trainer.seed", 0)
    _int(cfg, "trainer.log_every", 1)
    _int(cfg, "trainer.hist_every", 1)
    _int(cfg, "data.batch_size", 1)
    _int(cfg, "data.num_workers", 0)
    _int(cfg, "data.num_classes", 1)
    _int(cfg, "data.in_channels", 1)
    for key in ("mean", "std"):  # Normalize would fail deep inside the data loader instead
        values = cfg.data.get(key)
        if values is not None and len(values) != int(cfg.data.in_channels):
            raise ConfigError(f"data.{key} has {len(values)} value(s) but data.in_channels={cfg.data.in_channels}; "
                              f"give one per channel, e.g. data.{key}=[{','.join(['0.5'] * int(cfg.data.in_channels))}].")
    _choice(cfg, "trainer.amp", tuple(AMP_DTYPES))
    _choice(cfg, "model.layer", ("adder", "conv"))
    _choice(cfg, "optim.name", ("sgd",))
    _choice(cfg, "sched.name", ("cosine",))
    _num(cfg, "optim.lr", positive=True)
    _num(cfg, "optim.momentum")
    _num(cfg, "optim.weight_decay")
    _num(cfg, "sched.eta_min")
    if cfg.adaptive_lr.enabled:
        _num(cfg, "adaptive_lr.eta", positive=True)
    device = str(cfg.trainer.device)
    if device not in ("auto", "cpu") and not device.startswith("cuda"):
        raise ConfigError(f"trainer.device={device!r} is not valid; use auto, cpu, cuda or cuda:N.")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"trainer.device={device} but CUDA is not available here; use trainer.device=cpu "
                          f"(or auto).")


def device_type(cfg):
    """Device type, "cuda" or "cpu", from trainer.device (auto: CUDA when present)."""
    device = str(cfg.trainer.device)
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if device.startswith("cuda") else "cpu"


def model_from_config(cfg):
    """The model of cfg.model for the dataset of cfg.data (ConfigError on a bad name or form)."""
    try:
        from ..models import build_model
    except ImportError as e:
        raise ConfigError(f"addernet.models is not importable ({e}).") from None
    try:
        return build_model(cfg.model.name, layer=cfg.model.layer, num_classes=int(cfg.data.num_classes),
                           in_channels=int(cfg.data.in_channels))
    except (KeyError, ValueError, TypeError) as e:
        msg = e.args[0] if e.args else e
        raise ConfigError(f"cannot build model.name={cfg.model.name!r} (model.layer={cfg.model.layer}): {msg}. "
                          f"Pick a model with model=<name> (configs/model/).") from None


# --------------------------------------------------------------------------------------- state

def _rng_state():
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state):
    torch.set_rng_state(state["torch"].cpu())  # the checkpoint may have been mapped to a GPU
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def _write_jsonl(path, records):
    """Rewrite metrics.jsonl from the checkpoint's history (atomic), so a replayed epoch is not doubled."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    os.replace(tmp, path)


def _write_events(writer, record, alphas, model, histograms):
    """One epoch's TensorBoard points (x axis = epoch number, 1-based), flushed."""
    step = record["epoch"]
    for tag, key in (("train/loss", "train_loss"), ("train/top1", "train_top1"), ("val/loss", "val_loss"),
                     ("val/top1", "val_top1"), ("val/top5", "val_top5"), ("lr", "lr"), ("images_per_s", "images_per_s")):
        writer.add_scalar(tag, record[key], step)
    for name, alpha in alphas.items():
        writer.add_scalar(f"adaptive_lr/{name}", alpha, step)
    if histograms:
        for name, module in model.named_modules():
            if isinstance(module, Adder2d):
                writer.add_histogram(f"adder_weight/{name}", module.weight.detach().float().cpu(), step)
    writer.flush()


class _StopFlag:
    """SIGTERM sets the flag; the loop checks it after each step (on every rank, then agrees)."""

    def __init__(self):
        self.requested = False

    def __call__(self, signum, frame):
        self.requested = True  # nothing else here: a signal handler must not take locks (e.g. logging's)


# --------------------------------------------------------------------------------------- logging

def _setup_logging(run_dir, main):
    """Log to the console on every rank (warnings only off rank 0) and to train.log on rank 0."""
    logger = logging.getLogger("addernet")
    handlers = [logging.StreamHandler(sys.stderr)]
    if main:
        handlers.append(logging.FileHandler(os.path.join(run_dir, "train.log")))
    fmt = logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] %(message)s", "%Y-%m-%d %H:%M:%S")
    for h in handlers:
        h.setFormatter(fmt)
        logger.addHandler(h)
    old = (logger.level, logger.propagate)
    logger.setLevel(logging.INFO if main else logging.WARNING)
    logger.propagate = False

    def restore():
        for h in handlers:
            logger.removeHandler(h)
            h.close()
        logger.setLevel(old[0])
        logger.propagate = old[1]
    return restore


# --------------------------------------------------------------------------------------- train

def train(cfg, run_dir):
    """Train as ``cfg`` says, writing everything into ``run_dir`` (rank 0 only); returns a summary dict.

    ``run_dir`` is Hydra's ``hydra.runtime.output_dir``; under torchrun rank 0's dir is used by all.
    Raises ConfigError / DataError / CheckpointError for user mistakes, Preempted after SIGTERM and
    NonFiniteLoss on a NaN/inf loss (train.py turns them into a message and a non-zero exit).
    """
    check_config(cfg)
    if cfg.trainer.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # required by deterministic cuBLAS
    device = dist.init_distributed(device_type(cfg))
    if str(cfg.trainer.device).startswith("cuda:") and not dist.is_distributed():
        device = torch.device(str(cfg.trainer.device))
    try:
        return _train(cfg, run_dir, device)
    finally:
        dist.cleanup()


def _shared_run_dir(run_dir):
    """Every rank uses rank 0's run dir; a rank's own (empty) Hydra dir from a different second is removed."""
    mine = os.path.abspath(run_dir)
    shared = dist.broadcast_object(mine)
    if shared != mine:
        try:
            os.rmdir(mine)  # only succeeds when empty: nothing of value is ever removed
        except OSError:
            pass
    return shared


def _train(cfg, run_dir, device):
    rank, world, main = dist.get_rank(), dist.get_world_size(), dist.is_main()
    run_dir = _shared_run_dir(run_dir)
    ckpt_dir = os.path.join(run_dir, "checkpoints")
    if main:
        os.makedirs(ckpt_dir, exist_ok=True)
    dist.barrier()
    restore_logging = _setup_logging(run_dir, main)
    stop = _StopFlag()
    old_handler = signal.signal(signal.SIGTERM, stop)
    try:
        with logging_redirect_tqdm(loggers=[logging.getLogger("addernet")]):
            return _run(cfg, run_dir, ckpt_dir, device, rank, world, main, stop)
    finally:
        signal.signal(signal.SIGTERM, old_handler)
        restore_logging()


def _run(cfg, run_dir, ckpt_dir, device, rank, world, main, stop):
    tcfg, seed = cfg.trainer, int(cfg.trainer.seed)
    amp = _choice(cfg, "trainer.amp", tuple(AMP_DTYPES))
    torch.use_deterministic_algorithms(bool(tcfg.deterministic), warn_only=True)
    torch.backends.cudnn.benchmark = not tcfg.deterministic
    torch.manual_seed(seed + rank)
    random.seed(seed + rank)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    if main:
        OmegaConf.save(cfg, os.path.join(run_dir, "config.yaml"), resolve=True)
    log.info("run dir %s | %d process(es) | device %s | amp %s", run_dir, world, device, amp)

    # model, data, optimiser, schedule, scaler, adaptive LR
    model = model_from_config(cfg)  # before the data: a wrong model name fails before any download
    if tcfg.sync_bn and dist.is_distributed():
        if device.type == "cpu":
            raise ConfigError("trainer.sync_bn=true needs CUDA (torch's SyncBatchNorm does not run on CPU); "
                              "use trainer.sync_bn=false for CPU runs.")
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    memory_format = torch.channels_last if tcfg.channels_last else torch.contiguous_format
    model = model.to(device=device, memory_format=memory_format)
    log.info("model %s (%s): %d parameters", cfg.model.name, cfg.model.layer,
             sum(p.numel() for p in model.parameters()))
    train_loader = build_loader(cfg.data, "train", build_dataset(cfg.data, "train"), rank=rank, world_size=world,
                                seed=seed)
    val_loader = build_loader(cfg.data, "val", build_dataset(cfg.data, "val"), rank=rank, world_size=world,
                              seed=seed)
    log.info("data %s: %d train / %d val images, global batch %d", cfg.data.name, len(train_loader.dataset),
             len(val_loader.dataset.dataset), cfg.data.batch_size)

    optimizer = torch.optim.SGD(model.parameters(), lr=float(cfg.optim.lr), momentum=float(cfg.optim.momentum),
                                weight_decay=float(cfg.optim.weight_decay), nesterov=bool(cfg.optim.nesterov))
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=int(tcfg.epochs),
                                                           eta_min=float(cfg.sched.eta_min))
    scaler = torch.amp.GradScaler(device.type, enabled=amp == "fp16")
    adaptive = AdaptiveLR(model, float(cfg.adaptive_lr.eta)).attach(optimizer) if cfg.adaptive_lr.enabled else None
    ddp = (nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
           if dist.is_distributed() else model)

    # resume
    state = {"epoch": 0, "step": 0, "best_top1": -1.0, "best_epoch": 0, "history": []}
    path = tcfg.resume or os.path.join(ckpt_dir, "last.pt")
    path = dist.broadcast_object(os.path.abspath(path) if (tcfg.resume or os.path.isfile(path)) else None)
    train_sums, ckpt_rng = MetricSums(device), None
    if path:
        ckpt = load_checkpoint(path, map_location=device)
        missing = [k for k in ("model", "optimizer", "scheduler", "epoch", "format_version") if k not in ckpt]
        if missing:
            raise CheckpointError(f"{path} is not a training checkpoint of this repo (missing {', '.join(missing)});"
                                  f" to start from weights only, use a fresh run dir without trainer.resume.")
        load_weights(model, ckpt["model"], source=path,
                     hint=f"(built from model.name={cfg.model.name} model.layer={cfg.model.layer}; resume with the "
                          f"run's own model and data settings, or start a fresh run dir)")
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        scaler.load_state_dict(ckpt["scaler"])
        state.update({k: ckpt[k] for k in state})
        train_sums.load_state_dict(ckpt["train_sums"])
        ckpt_rng = ckpt["rng"][rank] if state["step"] and ckpt["world_size"] == world else None
        if state["step"] and ckpt["world_size"] != world:
            log.warning("mid-epoch checkpoint from %d process(es) resumed on %d: the rest of the epoch continues "
                        "at step %d of the new data split (not bit-exact)", ckpt["world_size"], world, state["step"])
        log.info("resumed from %s: %d epoch(s) done%s", path, state["epoch"],
                 f", {state['step']} step(s) into the next" if state["step"] else "")
    if main:
        _write_jsonl(os.path.join(run_dir, "metrics.jsonl"), state["history"])

    writer = None
    if main:
        from torch.utils.tensorboard import SummaryWriter
        writer = SummaryWriter(os.path.join(run_dir, "tensorboard"), purge_step=state["epoch"] + 1 if path else None)

    def checkpoint(step, sums, rng):
        """Full training state; rng holds every rank's RNG states (gathered) for a mid-epoch resume."""
        return {"format_version": FORMAT_VERSION, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(), "epoch": state["epoch"],
                "step": step, "best_top1": state["best_top1"], "best_epoch": state["best_epoch"],
                "history": state["history"], "train_sums": sums.state_dict(), "rng": rng, "config": resolved,
                "world_size": world}

    def gather_rng():
        rngs = [None] * world
        if dist.is_distributed():
            torch.distributed.all_gather_object(rngs, _rng_state())
        else:
            rngs[0] = _rng_state()
        return rngs

    epochs = int(tcfg.epochs)
    hist_every = int(tcfg.hist_every)
    for epoch in range(state["epoch"], epochs):
        t0 = time.perf_counter()
        lr = optimizer.param_groups[0]["lr"]
        seed_epoch(train_loader, seed, epoch, rank)
        start_step, state["step"] = min(state["step"], len(train_loader)), 0
        if not start_step:
            train_sums = MetricSums(device)
        ddp.train()
        batches = iter(train_loader)
        for _ in range(start_step):  # mid-epoch resume: replay the data stream up to the saved step
            next(batches)
        if ckpt_rng is not None:
            _set_rng_state(ckpt_rng)
            ckpt_rng = None
        bar = tqdm(total=len(train_loader), initial=start_step, desc=f"epoch {epoch + 1}/{epochs}",
                   disable=not (main and tcfg.progress), dynamic_ncols=True, leave=False)
        seen, t_train = 0, time.perf_counter()
        t_postfix = t_train
        for step, (images, target) in enumerate(batches, start=start_step + 1):
            images = images.to(device, non_blocking=True, memory_format=memory_format)
            target = target.to(device, non_blocking=True)
            with autocast(device, amp):
                logits = ddp(images)
            logits = logits.float().flatten(1)
            loss = F.cross_entropy(logits, target)
            if not torch.isfinite(loss):
                raise NonFiniteLoss(
                    f"non-finite loss ({loss.item()}) at epoch {epoch + 1} step {step}; stopped without saving, "
                    f"so checkpoints/last.pt still holds the last good state (epoch {state['epoch']}). Try a "
                    f"lower optim.lr, trainer.amp=off, or check the data.")
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)  # AdaptiveLR's pre-step hook runs here, on unscaled gradients
            scaler.update()
            train_sums.update(loss.detach() * target.shape[0], logits, target)
            seen += target.shape[0] * world
            rate = seen / max(time.perf_counter() - t_train, 1e-9)
            bar.update(1)
            log_step = step % tcfg.log_every == 0
            # Reading the running sums syncs with the device: at most twice a second for the bar.
            if log_step or (not bar.disable and time.perf_counter() - t_postfix > 0.5):
                t_postfix = time.perf_counter()
                running = train_sums.compute()
                bar.set_postfix(loss=f"{running['loss']:.3f}", top1=f"{running['top1']:.1f}",
                                img_s=f"{rate:.0f}", refresh=False)
                if log_step:
                    log.info("epoch %d/%d step %d/%d loss %.4f top1 %.2f img/s %.1f", epoch + 1, epochs, step,
                             len(train_loader), running["loss"], running["top1"], rate)
            if dist.any_rank(stop.requested, device):
                log.warning("SIGTERM: stopping after epoch %d step %d, saving checkpoints/last.pt", epoch + 1, step)
                rng = gather_rng()
                if main:
                    save_checkpoint(checkpoint(step, train_sums, rng), os.path.join(ckpt_dir, "last.pt"))
                dist.barrier()
                bar.close()
                if writer:
                    writer.close()
                raise Preempted(f"stopped by SIGTERM at epoch {epoch + 1} step {step}; saved "
                                f"{os.path.join(ckpt_dir, 'last.pt')}. Re-run with hydra.run.dir={run_dir} to "
                                f"resume (or trainer.resume=<that file>).")
        bar.close()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        train_seconds = time.perf_counter() - t_train
        train_metrics = train_sums.all_reduce().compute()
        val = evaluate(ddp, val_loader, device, amp=amp, channels_last=bool(tcfg.channels_last))
        scheduler.step()
        state["epoch"] = epoch + 1
        record = {"epoch": epoch + 1, "lr": lr, "train_loss": train_metrics["loss"], "train_top1": train_metrics["top1"],
                  "val_loss": val["loss"], "val_top1": val["top1"], "val_top5": val["top5"], "val_n": val["n"],
                  "epoch_seconds": time.perf_counter() - t0,
                  "images_per_s": seen / max(train_seconds, 1e-9),
                  "val_images_per_s": val["images_per_s"]}
        improved = val["top1"] > state["best_top1"]
        if improved:
            state["best_top1"], state["best_epoch"] = val["top1"], epoch + 1
        state["history"].append(record)
        log.info("epoch %d/%d lr %.5f | train loss %.4f top1 %.2f | val loss %.4f top1 %.2f top5 %.2f (n=%d) | "
                 "%.1fs %.0f img/s | best %.2f @%d", epoch + 1, epochs, lr, record["train_loss"],
                 record["train_top1"], record["val_loss"], record["val_top1"], record["val_top5"], val["n"],
                 record["epoch_seconds"], record["images_per_s"], state["best_top1"], state["best_epoch"])
        alphas = adaptive.alphas if adaptive else {}
        if main:
            # Order matters for crash safety: events and metrics first (a replayed epoch purges / rewrites
            # them), then best.pt, then last.pt (the commit point).
            _write_events(writer, record, alphas, model, histograms=epoch == 0 or (epoch + 1) % hist_every == 0
                          or epoch + 1 == epochs)
            with open(os.path.join(run_dir, "metrics.jsonl"), "a") as f:
                f.write(json.dumps(record) + "\n")
            final = checkpoint(0, MetricSums(), None)
            if improved:
                save_checkpoint(final, os.path.join(ckpt_dir, "best.pt"))
            save_checkpoint(final, os.path.join(ckpt_dir, "last.pt"))
        dist.barrier()

    last = state["history"][-1] if state["history"] else {}
    summary = {"best_top1": state["best_top1"], "best_epoch": state["best_epoch"], "epochs": state["epoch"],
               "final": last, "run_dir": run_dir}
    if main:
        hparams = {"model": cfg.model.name, "layer": cfg.model.layer, "data": cfg.data.name,
                   "epochs": epochs, "batch_size": int(cfg.data.batch_size), "lr": float(cfg.optim.lr),
                   "weight_decay": float(cfg.optim.weight_decay), "adaptive_lr": bool(cfg.adaptive_lr.enabled),
                   "eta": float(cfg.adaptive_lr.eta), "amp": amp, "seed": seed, "world_size": world}
        writer.add_hparams(hparams, {"hparam/best_top1": state["best_top1"],
                                     "hparam/final_top1": last.get("val_top1", float("nan"))}, run_name="hparams")
        writer.close()
        log.info("done: best val top1 %.2f at epoch %d; run dir %s", state["best_top1"], state["best_epoch"], run_dir)
    return summary
