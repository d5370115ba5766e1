"""``train_one_epoch``: the batch loop of one epoch; each batch goes through one optimizer step (step.py).

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
import time

import torch
from tqdm import tqdm

from .. import distributed as dist
from ..data import iter_from, seed_epoch
from ..errors import DataError, NonFiniteLoss
from ..forward import to_device
from .resume import set_rng_state

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

    def raise_if_bad(self, epoch, last_good):
        """NonFiniteLoss naming the step and ``last_good`` (where the last good state is) after a NaN/inf loss."""
        step = int(self.step.item())  # the host synchronisation of this check
        if step:
            raise NonFiniteLoss(
                f"non-finite loss ({self.loss.item()}) at epoch {epoch + 1} step {step}; stopped without saving, "
                f"so {last_good}. Try a lower optim.lr, trainer.amp=off, or check the data."
            )


def non_finite_state(model, task, device, record=None):
    """Names of what is NaN/inf: the epoch's losses in ``record``, any model or task tensor (agreed by all ranks)."""
    bad = [k for k in ("train_loss", "val_loss") if record is not None and not math.isfinite(record[k])]
    tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
    tensors.update({f"task.{n}.{k}": v for n, sd in task.extra_state_dicts().items() for k, v in sd.items()})
    floats = [(k, v) for k, v in tensors.items() if v.is_floating_point()]
    if floats:
        finite = torch.stack([torch.isfinite(v).all().to(device) for _, v in floats]).tolist()  # one sync
        bad += [k for (k, _), ok in zip(floats, finite) if not ok]
    if dist.any_rank(bool(bad), device) and not bad:
        bad = ["the state of another process"]
    return bad


def host_check(sums, watch, epoch, epochs, step, bar, seen, started, last_good):
    """The only host synchronisation of the step loop: NaN watch, log line, progress bar."""
    watch.raise_if_bad(epoch, last_good)
    running = sums.compute()
    rate = seen / max(time.perf_counter() - started, 1e-9)
    bar.set_postfix(loss=f"{running['loss']:.3f}", top1=f"{running['top1']:.1f}", img_s=f"{rate:.0f}", refresh=False)
    log.info(
        "epoch %d/%d step %d/%d loss %.4f top1 %.2f img/s %.1f",
        epoch + 1,
        epochs,
        step,
        bar.total,
        running["loss"],
        running["top1"],
        rate,
    )


NO_CHECKPOINT = "there is no good checkpoint to resume from (none was saved yet)"


def train_one_epoch(
    task, stepper, loader, sums, trainer, device, epoch, start_step=0, rng=None, stop=None, last_good=NO_CHECKPOINT
):
    """Train one epoch from ``start_step`` (a mid-epoch resume): every batch to the device and through one
    optimizer step (``stepper``, step.py), the loss watched for NaN/inf, a log line every trainer.log_every steps.

    Returns (images seen by all ranks, seconds, None), or (..., the step) once every rank has seen ``stop``
    (the SIGTERM / Ctrl-C flag, ``stop.requested``) after that step: the caller saves and stops. ``rng``: the
    RNG states of a mid-epoch checkpoint, restored once the epoch's data stream is in place; ``last_good``:
    where the last good state is, for the message of a NaN/inf loss.
    """
    seed_epoch(loader, trainer.seed, epoch, dist.get_rank())
    task.train()
    batches = iter_from(loader, start_step)  # mid-epoch resume: the data stream from the saved step
    if rng is not None:
        set_rng_state(rng)
    bar = tqdm(
        total=len(loader),
        initial=start_step,
        desc=f"epoch {epoch + 1}/{trainer.epochs}",
        disable=not (dist.is_main() and trainer.progress),
        dynamic_ncols=True,
        leave=False,
    )
    watch, vote, world = LossWatch(device), dist.StopVote(), dist.get_world_size()
    seen, started, step = 0, time.perf_counter(), start_step
    try:
        for step, (images, target) in enumerate(batches, start=start_step + 1):
            if target.shape[0] < 2:  # only after data.skip_corrupt dropped images: BatchNorm would fail
                raise DataError(
                    f"epoch {epoch + 1} step {step}: {target.shape[0]} image(s) left in a training batch "
                    f"after skipping corrupt ones, and BatchNorm needs 2; remove the corrupt files "
                    f"(named in the warnings above) or use a larger data.batch_size."
                )
            images, target = to_device(images, target, device, trainer.memory_format)
            stepper(images, target, sums, watch, step)  # micro-batches, clipping, step, EMA (step.py)
            seen += target.shape[0] * world
            bar.update(1)
            if step % trainer.log_every == 0:
                host_check(sums, watch, epoch, trainer.epochs, step, bar, seen, started, last_good)
            if vote.poll(stop is not None and stop.requested):  # a host flag: no device synchronisation
                watch.raise_if_bad(epoch, last_good)  # a NaN loss since the last host check: nothing is saved
                return seen, time.perf_counter() - started, step
        vote.finish()  # the last step's vote; the epoch's end agrees on the flag again before saving
    finally:
        bar.close()
    watch.raise_if_bad(epoch, last_good)  # the epoch-end check: before validation and any save
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return seen, time.perf_counter() - started, None
