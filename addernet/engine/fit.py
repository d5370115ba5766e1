"""The driver: ``train(cfg, run_dir)`` guards the run dir, builds the run in one phase (parts.py), runs the epochs.

Order at every epoch end, for crash safety: events and metrics first (a replayed epoch purges /
rewrites them), then best.pt, then last.pt (the commit point). ``last.pt`` is written atomically,
so a run killed at any moment resumes by replaying the interrupted epoch; with
trainer.deterministic=true on CPU it ends with exactly the metrics of an uninterrupted run.
"""

import logging
import os
import shlex
import signal
import time

import torch
from tqdm.contrib.logging import logging_redirect_tqdm

from .. import distributed as dist
from ..checkpoint import save_checkpoint, training_checkpoint
from ..data import take_skipped
from ..errors import ConfigError, NonFiniteLoss
from ..ops import use_backend
from .config import check_config, device_type
from .evaluation import evaluate
from .loop import LoopSettings, non_finite_state, train_epoch
from .meters import MetricSums
from .outputs import extra_keys, setup_logging
from .parts import build
from .precise_bn import precise_bn
from .resume import StopFlag, gather_rng
from .rundir import RunDirBusy, lock_run_dir, log_failure, remove_stale_temporaries

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
    settings = check_config(cfg)
    if settings.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # required by deterministic cuBLAS
    timeout = settings.dist_timeout
    device = dist.init_distributed(device_type(cfg), timeout)
    if settings.device.startswith("cuda:") and not dist.is_distributed():
        device = torch.device(settings.device)
    try:
        run_dir = _shared_run_dir(run_dir)
        lock, stale = _guard(run_dir)
        try:
            return _run(cfg, settings, run_dir, device, stale)
        finally:
            if lock is not None:
                lock.close()  # releases the run dir
    except Exception as e:
        peer = dist.peer_failure(e, timeout)
        if peer is not None:
            raise peer from None
        raise
    finally:
        dist.cleanup()


def _run(cfg, settings, run_dir, device, stale):
    """Build the run and fit it, with the stop signals caught (from the first moment) and train.log open."""
    stop = StopFlag()
    old_handlers = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    restore_logging = setup_logging(run_dir, dist.is_main())
    try:
        if stale:
            log.info("removed %d temporary file(s) of an interrupted write: %s", len(stale), ", ".join(stale))
        with logging_redirect_tqdm(loggers=[logging.getLogger("addernet")]), use_backend(settings.backend):
            return Run(build(cfg, settings, run_dir, device), stop).fit()
    finally:
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
        restore_logging()


def _guard(run_dir):
    """(the run dir's lock, stale temporaries removed) on rank 0: taken before anything in the dir is touched."""
    lock, stale, error = None, [], None
    if dist.is_main():
        try:
            lock = lock_run_dir(run_dir)
            os.makedirs(os.path.join(run_dir, "checkpoints"), exist_ok=True)
            stale = remove_stale_temporaries(run_dir)
        except ConfigError as e:
            error = e
    message = dist.broadcast_object(str(error) if error else None)
    if message:
        raise error or ConfigError(message)
    return lock, stale


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
    """Runs built Parts epoch by epoch; its only state is the counters (loop position, history, metric sums)."""

    def __init__(self, parts, stop):
        self.parts, self.stop = parts, stop
        start = parts.start.state
        self.state, self.pending_rng = {**start, "history": list(start["history"])}, parts.start.rng  # counters
        self.sums = parts.start.sums or MetricSums(parts.device)

    @property
    def ckpt_dir(self):
        return self.parts.ckpt_dir

    def fit(self):
        for epoch in range(self.state["epoch"], self.parts.settings.epochs):
            self.run_epoch(epoch)
        return self.finish()

    def checkpoint(self, step, sums, rng):
        """The full training state; ``rng`` holds every rank's RNG states for a mid-epoch resume."""
        p, s = self.parts, self.state
        ckpt = training_checkpoint(
            model=p.model.state_dict(),
            optimizer=p.optimizer.state_dict(),
            scheduler=p.scheduler.state_dict(),
            scaler=p.scaler.state_dict(),
            epoch=s["epoch"],
            step=step,
            best_top1=s["best_top1"],
            best_epoch=s["best_epoch"],
            history=s["history"],
            train_sums=sums.state_dict(),
            rng=rng,
            config=p.resolved,
            world_size=p.world,
            task=p.task.extra_state_dicts(),
            classes=p.classes,
        )
        if p.ema is not None:
            ckpt["ema"] = p.ema.state_dict()
        return ckpt

    def run_epoch(self, epoch):
        """Train, re-estimate BN (trainer.precise_bn), validate, record, save."""
        p, t0 = self.parts, time.perf_counter()
        lr = p.optimizer.param_groups[0]["lr"]
        seen, seconds = self.train_steps(epoch)
        train = self.sums.all_reduce().compute()
        bn_seconds = self.precise_bn()
        val = evaluate(p.task.net, p.val_loader, p.device, amp=p.settings.amp, channels_last=p.settings.channels_last)
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
        record.update(self.validate_others())
        if bn_seconds is not None:
            record["precise_bn_seconds"] = bn_seconds
        skipped = take_skipped(p.train_loader), take_skipped(p.val_loader)
        if any(skipped):
            log.warning(
                "epoch %d: skipped %d unreadable training and %d validation image(s) (data.skip_corrupt=true)",
                epoch + 1,
                *skipped,
            )
        p.scheduler.step()
        record.update(
            {
                "epoch_seconds": time.perf_counter() - t0,
                "images_per_s": seen / max(seconds, 1e-9),
                "val_images_per_s": val["images_per_s"],
            }
        )
        self.end_epoch(epoch, record)

    def train_steps(self, epoch):
        """The epoch's training steps (from the checkpoint's step after a mid-epoch resume): (images, seconds)."""
        p = self.parts
        start_step, self.state["step"] = min(self.state["step"], len(p.train_loader)), 0
        if not start_step:
            self.sums = MetricSums(p.device)
        take_skipped(p.train_loader)
        shared = {k: getattr(p.settings, k) for k in ("epochs", "seed", "memory_format", "log_every", "progress")}
        settings = LoopSettings(p.device, rank=p.rank, world=p.world, last_good=self.last_good(), **shared)
        rng, self.pending_rng = self.pending_rng, None
        return train_epoch(
            p.train_loader, p.task, p.stepper, self.sums, epoch, start_step, settings, self.stop, self.preempt, rng
        )

    def precise_bn(self):
        """Seconds spent re-estimating the BatchNorm statistics (trainer.precise_bn), None when it is off."""
        p = self.parts
        if not p.settings.precise_bn:
            return None
        return precise_bn(
            p.model,
            p.train_loader,
            p.settings.precise_bn,
            p.device,
            p.settings.amp,
            p.settings.memory_format,
            progress=p.main and p.settings.progress,
        )

    def validate_others(self):
        """Validation of the task's other models (a teacher) and the weight average: {<name>_val_<metric>: value}."""
        p, out = self.parts, {}
        models = dict(p.task.eval_models(), **({"ema": p.ema.module} if p.ema is not None else {}))
        for name, model in models.items():
            val = evaluate(model, p.val_loader, p.device, amp=p.settings.amp, channels_last=p.settings.channels_last)
            out.update({f"{name}_val_{k}": val[k] for k in ("loss", "top1", "top5")})
        return out

    def end_epoch(self, epoch, record):
        """Check, log and save the epoch (metrics first, then best.pt, then last.pt); stop if signalled."""
        p = self.parts
        bad = non_finite_state(p.model, p.task, p.device, record)  # before anything of this epoch is written
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
        self.log_epoch(record)
        if p.main:
            every, epochs = p.settings.hist_every, p.settings.epochs
            p.outputs.write_epoch(
                record,
                p.adaptive.alphas if p.adaptive else {},
                p.model,
                histograms=epoch == 0 or (epoch + 1) % every == 0 or epoch + 1 == epochs,
            )
            final = self.checkpoint(0, MetricSums(), None)
            if improved:
                save_checkpoint(final, os.path.join(self.ckpt_dir, "best.pt"))
            save_checkpoint(final, os.path.join(self.ckpt_dir, "last.pt"))
        dist.barrier()
        if epoch + 1 < p.settings.epochs and dist.any_rank(self.stop.requested, p.device):
            p.outputs.close()
            raise self.stop.error(f"stopped by {self.stop.name} after epoch {epoch + 1}; {self.resume_hint()}")

    def log_epoch(self, record):
        s = self.state
        extras = "".join(f" | {k} {record[k]:.4f}" for k in extra_keys(record))
        log.info(
            "epoch %d/%d lr %.5f | train loss %.4f top1 %.2f | val loss %.4f top1 %.2f top5 %.2f (n=%d) | "
            "%.1fs %.0f img/s | best %.2f @%d%s",
            record["epoch"],
            self.parts.settings.epochs,
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

    def resume_hint(self):
        """What a stopped run tells the user: the saved file, and a command that resumes it as it is."""
        last = os.path.join(self.ckpt_dir, "last.pt")
        return f"saved {last}. Resume with: python train.py hydra.run.dir={shlex.quote(self.parts.run_dir)}"

    def last_good(self):
        """Where the last good state is, for the message of a run that stops on NaN/inf (nothing bad is saved)."""
        if os.path.isfile(os.path.join(self.ckpt_dir, "last.pt")):
            return f"checkpoints/last.pt still holds the last good state (epoch {self.state['epoch']})"
        if self.parts.start.path:
            return f"the checkpoint this run resumed from ({self.parts.start.path}) is untouched"
        return "there is no good checkpoint to resume from (none was saved yet)"

    def preempt(self, epoch, step):
        """Save a mid-epoch last.pt (every rank's RNG included) and raise Preempted (Interrupted for Ctrl-C)."""
        p = self.parts
        bad = non_finite_state(p.model, p.task, p.device)
        if bad:
            raise NonFiniteLoss(
                f"{self.stop.name} at epoch {epoch + 1} step {step}, but the model state is not "
                f"finite ({', '.join(bad[:3])}): not saved, so {self.last_good()}. Try a lower "
                f"optim.lr."
            )
        log.warning("%s: stopping after epoch %d step %d, saving checkpoints/last.pt", self.stop.name, epoch + 1, step)
        rng = gather_rng(p.world)
        if p.main:
            save_checkpoint(self.checkpoint(step, self.sums, rng), os.path.join(self.ckpt_dir, "last.pt"))
        dist.barrier()
        p.outputs.close()
        raise self.stop.error(f"stopped by {self.stop.name} at epoch {epoch + 1} step {step}; {self.resume_hint()}")

    def finish(self):
        p, s = self.parts, self.state
        last = s["history"][-1] if s["history"] else {}
        if p.main:
            p.outputs.close(
                p.hparams,
                {"val_summary/best_top1": s["best_top1"], "val_summary/final_top1": last.get("val_top1", float("nan"))},
            )
            log.info("done: best val top1 %.2f at epoch %d; run dir %s", s["best_top1"], s["best_epoch"], p.run_dir)
        return {
            "best_top1": s["best_top1"],
            "best_epoch": s["best_epoch"],
            "epochs": s["epoch"],
            "final": last,
            "run_dir": p.run_dir,
        }
