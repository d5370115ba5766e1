"""The driver: ``train(cfg, run_dir)`` builds the run, resumes it, runs the epochs, tracks the best.

Order at every epoch end, for crash safety: events and metrics first (a replayed epoch purges /
rewrites them), then best.pt, then last.pt (the commit point). ``last.pt`` is written atomically,
so a run killed at any moment resumes by replaying the interrupted epoch; with
trainer.deterministic=true on CPU it ends with exactly the metrics of an uninterrupted run.
"""

import logging
import os
import random
import signal
import time

import torch
import torch.nn as nn
from omegaconf import OmegaConf
from tqdm.contrib.logging import logging_redirect_tqdm

from .. import distributed as dist
from ..checkpoint import save_checkpoint, training_checkpoint
from ..compile import compile_model
from ..data import build_dataset, build_loader, check_classes, class_names, num_workers, take_skipped
from ..data.mix import build_mix
from ..errors import ConfigError, NonFiniteLoss
from ..models import model_from_config, model_label
from ..ops import kernel_in_use, use_backend
from ..optim import AdaptiveLR, build_optimizer, build_scheduler
from ..tasks import build_task
from .config import check_config, device_type
from .ema import WeightEMA, check_ema_decay
from .evaluate import evaluate
from .loop import LoopSettings, non_finite_state, train_epoch
from .meters import MetricSums
from .outputs import RunOutputs, extra_keys, setup_logging, write_facts
from .precise_bn import has_batchnorm, precise_bn
from .resume import StopFlag, fresh_state, gather_rng, restore, resume_path
from .rundir import RunDirBusy, lock_run_dir, log_failure, remove_stale_temporaries
from .step import Stepper
from .trackers import build_trackers, selected

log = logging.getLogger("addernet.train")


def train(cfg, run_dir):
    """Train as ``cfg`` says, writing everything into ``run_dir`` (rank 0 only); returns a summary dict.

    ``run_dir`` is Hydra's ``hydra.runtime.output_dir``; under torchrun rank 0's dir is used by all.
    Raises an AdderNetError subclass for user mistakes (ConfigError, DataError, CheckpointError),
    Preempted after SIGTERM (Interrupted after Ctrl-C) and NonFiniteLoss on a NaN/inf loss or model
    state (train.py turns them into a message and the error's exit code); the error is also appended
    to the run's train.log.
    """
    try:
        return _train(cfg, run_dir)
    except Exception as e:
        if dist.env_rank() == 0 and not isinstance(e, RunDirBusy):  # a busy dir's log is another run's
            log_failure(os.path.abspath(run_dir), e)
        raise


def _train(cfg, run_dir):
    check_config(cfg)
    if cfg.trainer.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # required by deterministic cuBLAS
    device = dist.init_distributed(device_type(cfg), float(cfg.trainer.dist_timeout))
    if str(cfg.trainer.device).startswith("cuda:") and not dist.is_distributed():
        device = torch.device(str(cfg.trainer.device))
    try:
        run = Run(cfg, _shared_run_dir(run_dir), device)
        old_handlers = {sig: signal.signal(sig, run.stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        restore_logging = setup_logging(run.run_dir, run.main)
        try:
            with logging_redirect_tqdm(loggers=[logging.getLogger("addernet")]), use_backend(cfg.trainer.backend):
                return run.fit()
        finally:
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)
            restore_logging()
            if run.lock is not None:
                run.lock.close()  # releases the run dir
    except Exception as e:
        peer = dist.peer_failure(e, float(cfg.trainer.dist_timeout))
        if peer is not None:
            raise peer from None
        raise
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


class Run:
    """One training run: its config, built objects and loop state (what the loop functions share)."""

    def __init__(self, cfg, run_dir, device):
        self.cfg, self.run_dir, self.device = cfg, run_dir, device
        self.rank, self.world, self.main = dist.get_rank(), dist.get_world_size(), dist.is_main()
        self.ckpt_dir = os.path.join(run_dir, "checkpoints")
        self.seed, self.epochs, self.amp = int(cfg.trainer.seed), int(cfg.trainer.epochs), cfg.trainer.amp or "off"
        self.stop, self.state, self.pending_rng = StopFlag(), fresh_state(), None
        self.memory_format = torch.channels_last if cfg.trainer.channels_last else torch.contiguous_format
        self.lock, self.stale, self.resumed_from, error = None, [], None, None
        if self.main:  # the lock first: nothing in the run dir is touched while another run holds it
            try:
                self.lock = lock_run_dir(run_dir)
                os.makedirs(self.ckpt_dir, exist_ok=True)
                self.stale = remove_stale_temporaries(run_dir)
            except ConfigError as e:
                error = e
        message = dist.broadcast_object(str(error) if error else None)
        if message:
            raise error or ConfigError(message)

    def build(self):
        """Model, task, data, optimizer, schedule, scaler, adaptive LR, DDP (a wrong model fails before data)."""
        cfg, device = self.cfg, self.device
        model = model_from_config(cfg)
        if cfg.trainer.sync_bn and dist.is_distributed():
            if device.type == "cpu":
                raise ConfigError(
                    "trainer.sync_bn=true needs CUDA (torch's SyncBatchNorm does not run on CPU); "
                    "use trainer.sync_bn=false for CPU runs."
                )
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        self.model = compile_model(model.to(device=device, memory_format=self.memory_format), cfg.trainer.compile)
        log.info("model %s: %d parameters", model_label(cfg.model), sum(p.numel() for p in model.parameters()))
        self.task = build_task(self.model, cfg)
        self.task.to(device=device, memory_format=self.memory_format)  # its own modules (a teacher, a head)
        self.task.amp = self.amp
        train_set, val_set = build_dataset(cfg.data, "train"), build_dataset(cfg.data, "val")
        self.classes = class_names(train_set)
        check_classes(
            self.classes,
            val_set,
            f"the training set {getattr(train_set, 'root', '')}".rstrip(),
            "give the train and val folders the same class folder names",
        )
        self.train_loader, self.val_loader = (
            build_loader(cfg.data, split, ds, rank=self.rank, world_size=self.world, seed=self.seed, device=device)
            for split, ds in (("train", train_set), ("val", val_set))
        )
        log.info(
            "data %s: %d train / %d val images, global batch %d",
            cfg.data.name,
            len(self.train_loader.dataset),
            len(self.val_loader.dataset.dataset),
            cfg.data.batch_size,
        )
        self.optimizer = build_optimizer(cfg.optim, self.task.param_groups())
        self.scheduler = build_scheduler(cfg.sched, self.optimizer, self.epochs)
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.amp == "fp16")
        self.adaptive = (
            AdaptiveLR(self.model, float(cfg.adaptive_lr.eta)).attach(self.optimizer)
            if cfg.adaptive_lr.enabled
            else None
        )
        if dist.is_distributed():
            self.task.distribute(
                lambda m: nn.parallel.DistributedDataParallel(
                    m, device_ids=[device.index] if device.type == "cuda" else None
                )
            )
        self.sums = MetricSums(device)
        accumulate = int(cfg.trainer.accumulate)
        if int(cfg.data.batch_size) // self.world < 2 * accumulate:
            raise ConfigError(
                f"trainer.accumulate={accumulate} splits each process's batch of "
                f"{int(cfg.data.batch_size) // self.world} into micro-batches of fewer than 2 samples "
                f"(BatchNorm needs 2); use a larger data.batch_size or a smaller trainer.accumulate."
            )
        decay = check_ema_decay(cfg.trainer)
        self.ema = WeightEMA(self.model, decay) if decay is not None else None
        self.stepper = Stepper(
            self.task,
            self.optimizer,
            self.scaler,
            self.adaptive,
            accumulate,
            cfg.trainer.clip_grad_norm,
            self.ema,
            build_mix(cfg.data),
        )

    def checkpoint(self, step, sums, rng):
        """The full training state; ``rng`` holds every rank's RNG states for a mid-epoch resume."""
        s = self.state
        ckpt = training_checkpoint(
            model=self.model.state_dict(),
            optimizer=self.optimizer.state_dict(),
            scheduler=self.scheduler.state_dict(),
            scaler=self.scaler.state_dict(),
            epoch=s["epoch"],
            step=step,
            best_top1=s["best_top1"],
            best_epoch=s["best_epoch"],
            history=s["history"],
            train_sums=sums.state_dict(),
            rng=rng,
            config=self.resolved,
            world_size=self.world,
            task=self.task.extra_state_dicts(),
            classes=self.classes,
        )
        if self.ema is not None:
            ckpt["ema"] = self.ema.state_dict()
        return ckpt

    def fit(self):
        cfg = self.cfg
        torch.use_deterministic_algorithms(bool(cfg.trainer.deterministic), warn_only=True)
        torch.backends.cudnn.benchmark = not cfg.trainer.deterministic
        torch.manual_seed(self.seed + self.rank)
        random.seed(self.seed + self.rank)
        if cfg.data.num_workers == "auto":  # recorded as the number used (it changes the augmentation stream)
            self.cfg = cfg = OmegaConf.merge(cfg, {"data": {"num_workers": num_workers(cfg.data)}})  # a copy
        kernel = kernel_in_use(self.device)
        log.info(
            "run dir %s | %d process(es) | device %s | amp %s | adder backend %s (%s kernel)",
            self.run_dir,
            self.world,
            self.device,
            self.amp,
            cfg.trainer.backend,
            kernel,
        )
        if self.stale:
            log.info("removed %d temporary file(s) of an interrupted write: %s", len(self.stale), ", ".join(self.stale))
        path = self.resumed_from = resume_path(cfg, self.run_dir, self.ckpt_dir)  # refuses to overwrite a history
        self.build()
        if path:  # refuses a different model, before the config is rewritten
            resumed = restore(
                path,
                cfg,
                model=self.model,
                task=self.task,
                optimizer=self.optimizer,
                scheduler=self.scheduler,
                scaler=self.scaler,
                sums=self.sums,
                ema=self.ema,
                train_dataset=self.train_loader.dataset,
                device=self.device,
                world=self.world,
                rank=self.rank,
            )
            self.state, self.pending_rng, self.scheduler = resumed.state, resumed.rng, resumed.scheduler
        self.resolved = OmegaConf.to_container(cfg, resolve=True)
        if self.main:
            OmegaConf.save(cfg, os.path.join(self.run_dir, "config.yaml"), resolve=True)
        if self.main:
            write_facts(
                self.run_dir,
                {
                    "device": str(self.device),
                    "world_size": self.world,
                    "train_images": len(self.train_loader.dataset),
                    "val_images": len(self.val_loader.dataset.dataset),
                    "data_held_on": str(self.train_loader.device) if cfg.data.get("on_device") else None,
                    "compiled": getattr(self.model, "_compiled_call_impl", None) is not None,
                    "adder_kernel": kernel,
                },
            )
        loggers = selected(cfg)
        self.outputs = RunOutputs(
            self.run_dir,
            self.main,
            self.state["epoch"] if path else None,
            tensorboard="tensorboard" in loggers,
            trackers=build_trackers(cfg, self.run_dir, self.resolved, self.hparams()) if self.main else (),
        )
        self.outputs.rewrite_metrics(self.state["history"])
        for epoch in range(self.state["epoch"], self.epochs):
            self.run_epoch(epoch)
        return self.finish()

    def run_epoch(self, epoch):
        """Train, validate, record, save; a SIGTERM that came after the last step check stops here."""
        t0, lr = time.perf_counter(), self.optimizer.param_groups[0]["lr"]
        start_step, self.state["step"] = min(self.state["step"], len(self.train_loader)), 0
        if not start_step:
            self.sums = MetricSums(self.device)
        take_skipped(self.train_loader)
        settings = LoopSettings(
            device=self.device,
            epochs=self.epochs,
            seed=self.seed,
            rank=self.rank,
            world=self.world,
            memory_format=self.memory_format,
            log_every=int(self.cfg.trainer.log_every),
            progress=bool(self.cfg.trainer.progress),
            last_good=self.last_good(),
        )
        rng, self.pending_rng = self.pending_rng, None
        seen, seconds = train_epoch(
            self.train_loader,
            self.task,
            self.stepper,
            self.sums,
            epoch,
            start_step,
            settings,
            self.stop,
            self.preempt,
            rng,
        )
        train = self.sums.all_reduce().compute()
        bn_batches = int(self.cfg.trainer.precise_bn)
        if bn_batches and has_batchnorm(self.model):
            bn_seconds = precise_bn(
                self.model,
                self.train_loader,
                bn_batches,
                self.device,
                self.amp,
                self.memory_format,
                progress=self.main and bool(self.cfg.trainer.progress),
            )
        val = evaluate(
            self.task.net,
            self.val_loader,
            self.device,
            amp=self.amp,
            channels_last=bool(self.cfg.trainer.channels_last),
        )
        record = {
            "epoch": epoch + 1,
            "lr": lr,
            "train_loss": train["loss"],
            "train_top1": train["top1"],
            "val_loss": val["loss"],
            "val_top1": val["top1"],
            "val_top5": val["top5"],
            "val_n": val["n"],
        }
        record.update({f"train_{k}": v for k, v in train.items() if k not in ("loss", "top1", "top5", "n")})
        models = dict(self.task.eval_models(), **({"ema": self.ema.module} if self.ema is not None else {}))
        for name, extra in models.items():
            other = evaluate(
                extra, self.val_loader, self.device, amp=self.amp, channels_last=bool(self.cfg.trainer.channels_last)
            )
            record.update({f"{name}_val_{k}": other[k] for k in ("loss", "top1", "top5")})
        if bn_batches and has_batchnorm(self.model):
            record["precise_bn_seconds"] = bn_seconds
        skipped = take_skipped(self.train_loader), take_skipped(self.val_loader)
        if any(skipped):
            log.warning(
                "epoch %d: skipped %d unreadable training and %d validation image(s) (data.skip_corrupt=true)",
                epoch + 1,
                *skipped,
            )
        self.scheduler.step()
        record.update(
            {
                "epoch_seconds": time.perf_counter() - t0,
                "images_per_s": seen / max(seconds, 1e-9),
                "val_images_per_s": val["images_per_s"],
            }
        )
        self.end_epoch(epoch, record)

    def end_epoch(self, epoch, record):
        bad = non_finite_state(self.model, self.task, self.device, record)  # before anything of this epoch is written
        if bad:
            raise NonFiniteLoss(
                f"epoch {epoch + 1} ended with non-finite {', '.join(bad[:4])}"
                f"{' ...' if len(bad) > 4 else ''} (val loss {record['val_loss']}); nothing of this "
                f"epoch was saved, so {self.last_good()}. Try a lower optim.lr, trainer.amp=off, or "
                f"check the data."
            )
        s = self.state
        s["epoch"] = epoch + 1
        improved = record["val_top1"] > s["best_top1"]
        if improved:
            s["best_top1"], s["best_epoch"] = record["val_top1"], epoch + 1
        s["history"].append(record)
        extras = "".join(f" | {k} {record[k]:.4f}" for k in extra_keys(record))
        log.info(
            "epoch %d/%d lr %.5f | train loss %.4f top1 %.2f | val loss %.4f top1 %.2f top5 %.2f (n=%d) | "
            "%.1fs %.0f img/s | best %.2f @%d%s",
            epoch + 1,
            self.epochs,
            record["lr"],
            record["train_loss"],
            record["train_top1"],
            record["val_loss"],
            record["val_top1"],
            record["val_top5"],
            record["val_n"],
            record["epoch_seconds"],
            record["images_per_s"],
            s["best_top1"],
            s["best_epoch"],
            extras,
        )
        if self.main:
            hist_every = int(self.cfg.trainer.hist_every)
            self.outputs.write_epoch(
                record,
                self.adaptive.alphas if self.adaptive else {},
                self.model,
                histograms=epoch == 0 or (epoch + 1) % hist_every == 0 or epoch + 1 == self.epochs,
            )
            final = self.checkpoint(0, MetricSums(), None)
            if improved:
                save_checkpoint(final, os.path.join(self.ckpt_dir, "best.pt"))
            save_checkpoint(final, os.path.join(self.ckpt_dir, "last.pt"))
        dist.barrier()
        if epoch + 1 < self.epochs and dist.any_rank(self.stop.requested, self.device):
            self.outputs.close()
            raise self.stop.error(
                f"stopped by {self.stop.name} after epoch {epoch + 1}; saved "
                f"{os.path.join(self.ckpt_dir, 'last.pt')}. Re-run with hydra.run.dir="
                f"{self.run_dir} to resume."
            )

    def last_good(self):
        """Where the last good state is, for the message of a run that stops on NaN/inf (nothing bad is saved)."""
        if os.path.isfile(os.path.join(self.ckpt_dir, "last.pt")):
            return f"checkpoints/last.pt still holds the last good state (epoch {self.state['epoch']})"
        if self.resumed_from:
            return f"the checkpoint this run resumed from ({self.resumed_from}) is untouched"
        return "there is no good checkpoint to resume from (none was saved yet)"

    def preempt(self, epoch, step):
        """Save a mid-epoch last.pt (every rank's RNG included) and raise Preempted (Interrupted for Ctrl-C)."""
        bad = non_finite_state(self.model, self.task, self.device)
        if bad:
            raise NonFiniteLoss(
                f"{self.stop.name} at epoch {epoch + 1} step {step}, but the model state is not "
                f"finite ({', '.join(bad[:3])}): not saved, so {self.last_good()}. Try a lower "
                f"optim.lr."
            )
        log.warning("%s: stopping after epoch %d step %d, saving checkpoints/last.pt", self.stop.name, epoch + 1, step)
        rng = gather_rng(self.world)
        last = os.path.join(self.ckpt_dir, "last.pt")
        if self.main:
            save_checkpoint(self.checkpoint(step, self.sums, rng), last)
        dist.barrier()
        self.outputs.close()
        raise self.stop.error(
            f"stopped by {self.stop.name} at epoch {epoch + 1} step {step}; saved {last}. Re-run "
            f"with hydra.run.dir={self.run_dir} to resume."
        )

    def hparams(self):
        """The run's hyper-parameters for the trackers (TensorBoard's hparams, MLflow params, W&B config)."""
        cfg = self.cfg
        return {
            "model": cfg.model.name,
            "layer": cfg.model.layer,
            "data": cfg.data.name,
            "task": cfg.task.name,
            "epochs": self.epochs,
            "batch_size": int(cfg.data.batch_size),
            "lr": float(cfg.optim.lr),
            "weight_decay": float(cfg.optim.weight_decay),
            "adaptive_lr": bool(cfg.adaptive_lr.enabled),
            "eta": float(cfg.adaptive_lr.eta),
            "amp": self.amp,
            "seed": self.seed,
            "world_size": self.world,
        }

    def finish(self):
        s = self.state
        last = s["history"][-1] if s["history"] else {}
        if self.main:
            self.outputs.close(
                self.hparams(),
                {"val_summary/best_top1": s["best_top1"], "val_summary/final_top1": last.get("val_top1", float("nan"))},
            )
            log.info("done: best val top1 %.2f at epoch %d; run dir %s", s["best_top1"], s["best_epoch"], self.run_dir)
        return {
            "best_top1": s["best_top1"],
            "best_epoch": s["best_epoch"],
            "epochs": s["epoch"],
            "final": last,
            "run_dir": self.run_dir,
        }
