"""Resume state: the loop position, RNG states, the SIGTERM flag, and restoring a run from last.pt.

Exactness rests on one rule: every epoch's randomness is a pure function of (seed, epoch, rank)
(addernet.data.seed_epoch), so replaying an interrupted epoch reproduces it. A mid-epoch
checkpoint (SIGTERM) additionally holds the step count and every rank's RNG states; resuming
fast-forwards the epoch's data stream to that step (loading, not training) and restores them.
"""
import logging
import os
import random
import signal
import warnings

import torch

from .. import distributed as dist
from ..checkpoint import check_training_checkpoint, load_checkpoint, load_weights
from ..data import check_classes
from ..errors import Interrupted, Preempted
from ..optim import build_scheduler
from .config import check_stored_model

log = logging.getLogger("addernet.train")


def rng_state():
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state):
    torch.set_rng_state(state["torch"].cpu())  # the checkpoint may have been mapped to a GPU
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def gather_rng(world):
    """Every rank's RNG states, in rank order (collective under torchrun)."""
    rngs = [None] * world
    if dist.is_distributed():
        torch.distributed.all_gather_object(rngs, rng_state())
    else:
        rngs[0] = rng_state()
    return rngs


class StopFlag:
    """SIGTERM / SIGINT set the flag; the loop reads it at its host checks (every rank, then they agree).

    A second SIGINT (Ctrl-C pressed again) raises KeyboardInterrupt at once: the user asked to stop now.
    """

    def __init__(self):
        self.requested, self.signum = False, None

    def __call__(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt  # nothing else here: a signal handler must not take locks (e.g. logging's)
        self.requested, self.signum = True, self.signum or signum

    @property
    def name(self):
        return "SIGINT (Ctrl-C)" if self.signum == signal.SIGINT else "SIGTERM"

    @property
    def error(self):
        """The error class to raise once stopped: its exit code is 128 + the signal number."""
        return Interrupted if self.signum == signal.SIGINT else Preempted


def fresh_state():
    return {"epoch": 0, "step": 0, "best_top1": -1.0, "best_epoch": 0, "history": []}


def resume_path(cfg, ckpt_dir):
    """trainer.resume, else <run dir>/checkpoints/last.pt when present, else None (rank 0's answer)."""
    path = cfg.trainer.resume or os.path.join(ckpt_dir, "last.pt")
    found = cfg.trainer.resume or os.path.isfile(path)
    return dist.broadcast_object(os.path.abspath(path) if found else None)


def restore(run, path):
    """Load last.pt into the run's model, task, optimizer, scheduler, scaler and sums; returns its RNG or None."""
    ckpt = check_training_checkpoint(load_checkpoint(path, map_location=run.device), path)
    cfg, stored = run.cfg, ckpt.get("config") or {}
    fix = "resume with the run's own settings, or start a fresh run dir (hydra.run.dir=...)"
    check_stored_model(cfg, stored, path, ("name", "layer"), fix)
    check_classes(ckpt.get("classes"), run.train_loader.dataset, f"{path}", fix)
    load_weights(run.model, ckpt["model"], source=path,
                 hint=f"(built from model.name={cfg.model.name} model.layer={cfg.model.layer}; resume with the "
                      f"run's own model and data settings, or start a fresh run dir)")
    run.task.load_state_dict(ckpt.get("task", {}), source=path)
    if run.ema is not None and ckpt.get("ema"):
        run.ema.load_state_dict(ckpt["ema"])
    elif run.ema is not None:
        log.warning("%s holds no weight average: trainer.ema_decay starts one from the resumed weights", path)
    run.optimizer.load_state_dict(ckpt["optimizer"])
    run.scheduler.load_state_dict(ckpt["scheduler"])
    run.scaler.load_state_dict(ckpt["scaler"])
    run.state.update({k: ckpt[k] for k in fresh_state()})
    run.sums.load_state_dict(ckpt["train_sums"])
    step, same_world = run.state["step"], ckpt["world_size"] == run.world
    if step and not same_world:
        log.warning("mid-epoch checkpoint from %d process(es) resumed on %d: the rest of the epoch continues "
                    "at step %d of the new data split (not bit-exact)", ckpt["world_size"], run.world, step)
    log.info("resumed from %s: %d epoch(s) done%s", path, run.state["epoch"],
             f", {step} step(s) into the next" if step else "")
    planned = stored.get("trainer", {}).get("epochs", run.epochs)
    if planned != run.epochs:
        reschedule(run, planned)
    return ckpt["rng"][run.rank] if step and same_world else None


def reschedule(run, planned):
    """A resumed run with a new trainer.epochs: the schedule of a run planned for the new length, at this epoch.

    The learning rate from here on is what a run started with the new trainer.epochs would have at the
    same epoch (e.g. cosine: eta_min + (lr - eta_min) * (1 + cos(pi * epoch / new_epochs)) / 2), so
    extending a finished 2-epoch cosine run to 3 trains epoch 3 at lr/4, not at 0.
    """
    if run.state["epoch"] >= run.epochs:
        log.warning("the checkpoint already has %d epoch(s), trainer.epochs=%d: nothing left to train",
                    run.state["epoch"], run.epochs)
        return
    for group in run.optimizer.param_groups:
        group["lr"] = group["initial_lr"]
    run.scheduler = build_scheduler(run.cfg.sched, run.optimizer, run.epochs)
    with warnings.catch_warnings():  # "scheduler.step() before optimizer.step()": replaying, not training
        warnings.simplefilter("ignore", UserWarning)
        for _ in range(run.state["epoch"]):
            run.scheduler.step()
    log.warning("trainer.epochs changed from %d (the checkpoint's) to %d: the %s schedule is recomputed for %d "
                "epochs and continues at epoch %d with lr %.6g", planned, run.epochs, run.cfg.sched.name, run.epochs,
                run.state["epoch"] + 1, run.optimizer.param_groups[0]["lr"])
