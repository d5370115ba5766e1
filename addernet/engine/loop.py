"""The epoch of training steps: the task computes the loss, the loop back-propagates and steps.

Nothing in a step waits for the device. The loss is watched for NaN/inf on the device, and the
host looks at it and at the running metrics only in ``host_check``: every ``trainer.log_every``
steps and at the epoch end, so a NaN still stops the run before anything is saved. The SIGTERM /
Ctrl-C flag is a host-side flag, read after every step: one process stops at the next step; under
torchrun the ranks agree on it through a non-blocking vote over a CPU group (distributed.StopVote),
started at one step and read at the next, so every rank saves at the same step and the GPU stream
never waits. A pre-emption therefore saves within one or two steps, whatever trainer.log_every is.
"""
import logging
import math
import os
import time

import torch
from tqdm import tqdm

from .. import distributed as dist
from ..checkpoint import save_checkpoint
from ..data import iter_from, seed_epoch
from ..errors import DataError, NonFiniteLoss
from ..forward import to_device
from .resume import gather_rng, set_rng_state

log = logging.getLogger("addernet.train")


class LossWatch:
    """Remembers, on the device, the first step whose loss was not finite and that loss."""

    def __init__(self, device):
        self.step = torch.zeros((), dtype=torch.int64, device=device)
        self.loss = torch.zeros((), dtype=torch.float32, device=device)

    def update(self, loss, step):
        loss = loss.detach().float()
        first = ~torch.isfinite(loss) & (self.step == 0)
        self.step = torch.where(first, step, self.step)
        self.loss = torch.where(first, loss, self.loss)

    def raise_if_bad(self, epoch, run):
        step = int(self.step.item())  # the host synchronisation of this check
        if step:
            raise NonFiniteLoss(
                f"non-finite loss ({self.loss.item()}) at epoch {epoch + 1} step {step}; stopped without saving, "
                f"so {last_good(run)}. Try a lower optim.lr, trainer.amp=off, or check the data.")


def last_good(run):
    """Where the last good state is, for the message of a run that stops on NaN/inf (nothing bad is saved)."""
    if os.path.isfile(os.path.join(run.ckpt_dir, "last.pt")):
        return f"checkpoints/last.pt still holds the last good state (epoch {run.state['epoch']})"
    if getattr(run, "resumed_from", None):
        return f"the checkpoint this run resumed from ({run.resumed_from}) is untouched"
    return "there is no good checkpoint to resume from (none was saved yet)"


def non_finite_state(run, record=None):
    """Names of what is NaN/inf: the epoch's losses in ``record``, any model or task tensor (agreed by all ranks)."""
    bad = [k for k in ("train_loss", "val_loss") if record is not None and not math.isfinite(record[k])]
    tensors = {f"model.{k}": v for k, v in run.model.state_dict().items()}
    tensors.update({f"task.{n}.{k}": v for n, sd in run.task.state_dict().items() for k, v in sd.items()})
    floats = [(k, v) for k, v in tensors.items() if v.is_floating_point()]
    if floats:
        finite = torch.stack([torch.isfinite(v).all().to(run.device) for _, v in floats]).tolist()  # one sync
        bad += [k for (k, _), ok in zip(floats, finite) if not ok]
    if dist.any_rank(bool(bad), run.device) and not bad:
        bad = ["the state of another process"]
    return bad


def host_check(run, watch, epoch, step, bar, seen, started):
    """The only host synchronisation of the step loop: NaN watch, log line, SIGTERM agreement."""
    watch.raise_if_bad(epoch, run)
    running = run.sums.compute()
    rate = seen / max(time.perf_counter() - started, 1e-9)
    bar.set_postfix(loss=f"{running['loss']:.3f}", top1=f"{running['top1']:.1f}", img_s=f"{rate:.0f}", refresh=False)
    log.info("epoch %d/%d step %d/%d loss %.4f top1 %.2f img/s %.1f", epoch + 1, run.epochs, step,
             len(run.train_loader), running["loss"], running["top1"], rate)


def preempt(run, watch, epoch, step, bar):
    """Save a mid-epoch last.pt (every rank's RNG included) and raise Preempted (Interrupted for Ctrl-C)."""
    watch.raise_if_bad(epoch, run)  # a NaN loss since the last host check: nothing is saved
    bad = non_finite_state(run)
    if bad:
        raise NonFiniteLoss(f"{run.stop.name} at epoch {epoch + 1} step {step}, but the model state is not finite "
                            f"({', '.join(bad[:3])}): not saved, so {last_good(run)}. Try a lower optim.lr.")
    log.warning("%s: stopping after epoch %d step %d, saving checkpoints/last.pt", run.stop.name, epoch + 1, step)
    rng = gather_rng(run.world)
    last = os.path.join(run.ckpt_dir, "last.pt")
    if run.main:
        save_checkpoint(run.checkpoint(step, run.sums, rng), last)
    dist.barrier()
    bar.close()
    run.outputs.close()
    raise run.stop.error(f"stopped by {run.stop.name} at epoch {epoch + 1} step {step}; saved {last}. Re-run with "
                         f"hydra.run.dir={run.run_dir} to resume.")


def train_epoch(run, epoch, start_step):
    """Train one epoch from ``start_step`` (a mid-epoch resume); returns (images seen by all ranks, seconds)."""
    seed_epoch(run.train_loader, run.seed, epoch, run.rank)
    run.task.train()
    batches = iter_from(run.train_loader, start_step)  # mid-epoch resume: the data stream from the saved step
    if run.pending_rng is not None:
        set_rng_state(run.pending_rng)
        run.pending_rng = None
    bar = tqdm(total=len(run.train_loader), initial=start_step, desc=f"epoch {epoch + 1}/{run.epochs}",
               disable=not (run.main and run.cfg.trainer.progress), dynamic_ncols=True, leave=False)
    watch, log_every, vote = LossWatch(run.device), int(run.cfg.trainer.log_every), dist.StopVote()
    seen, started, step = 0, time.perf_counter(), start_step
    for step, (images, target) in enumerate(batches, start=start_step + 1):
        if target.shape[0] < 2:  # only after data.skip_corrupt dropped images: BatchNorm would fail
            raise DataError(f"epoch {epoch + 1} step {step}: {target.shape[0]} image(s) left in a training batch "
                            f"after skipping corrupt ones, and BatchNorm needs 2; remove the corrupt files "
                            f"(named in the warnings above) or use a larger data.batch_size.")
        images, target = to_device(images, target, run.device, run.memory_format)
        run.stepper(images, target, run.sums, watch, step)  # micro-batches, clipping, step, EMA (step.py)
        seen += target.shape[0] * run.world
        bar.update(1)
        if step % log_every == 0:
            host_check(run, watch, epoch, step, bar, seen, started)
        if vote.poll(run.stop.requested):  # a host flag: no device synchronisation
            preempt(run, watch, epoch, step, bar)
    vote.finish()  # the last step's vote; end_epoch agrees on the flag again before saving
    bar.close()
    watch.raise_if_bad(epoch, run)  # the epoch-end check: before validation and any save
    if run.device.type == "cuda":
        torch.cuda.synchronize(run.device)
    return seen, time.perf_counter() - started
