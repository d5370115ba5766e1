"""Resume: the loop position, RNG states, the SIGTERM flag, which checkpoint a run resumes from, which settings
may change on resume, and restoring a run from last.pt.

Exactness rests on one rule: every epoch's randomness is a pure function of (seed, epoch, rank)
(addernet.data.seed_epoch), so replaying an interrupted epoch reproduces it. A mid-epoch
checkpoint (SIGTERM) additionally holds the step count and every rank's RNG states; resuming
fast-forwards the epoch's data stream to that step (loading, not training) and restores them.

Which checkpoint (``choose_resume``, rank 0 decides):
  1. the run dir's own ``checkpoints/last.pt`` when it exists (it wins over trainer.resume, so a
     re-queued job with the same command continues its own later epochs, and the log says so);
  2. else ``trainer.resume`` when given (a run dir stands for its ``checkpoints/last.pt``);
  3. else a fresh start, but only in a run dir that holds no history: a dir with ``best.pt`` or a
     non-empty ``metrics.jsonl`` but no ``last.pt`` is refused with the choices (resume from best.pt,
     a fresh dir, or delete those files).

Which settings (``config_changes``): the resolved config of the run is compared with the one stored in
the checkpoint, key by key.
  MAY_CHANGE   applied and logged (the run's length, logging, workers, where the data lies, ...);
  NEVER        refused always: the checkpoint's weights or optimizer state belong to the old value;
  any other    refused with the list of differing keys unless ``trainer.resume_override=true``, which
               applies them from the resume point on (logged; config.yaml records them).
A key the checkpoint does not record (an option newer than the checkpoint) is taken as given and logged.
"""

import dataclasses
import logging
import os
import random
import signal
import warnings

import torch
from omegaconf import OmegaConf

from .. import distributed as dist
from ..checkpoint import check_training_checkpoint, load_checkpoint, load_weights
from ..data import check_classes
from ..errors import CheckpointError, ConfigError, Interrupted, Preempted
from ..optim import build_scheduler
from .config import check_stored_model

log = logging.getLogger("addernet.train")


MAY_CHANGE = (
    "trainer.epochs",
    "trainer.log_every",
    "trainer.hist_every",
    "trainer.progress",
    "trainer.resume",
    "trainer.resume_override",
    "trainer.device",
    "trainer.backend",
    "trainer.compile",
    "trainer.cuda_graph",
    "trainer.channels_last",
    "trainer.deterministic",
    "trainer.dist_timeout",
    "data.num_workers",
    "data.pin_memory",
    "data.root",
    "data.train_dir",
    "data.val_dir",
    "data.download",
    "data.skip_corrupt",
    "trainer.precise_bn",
    "trainer.retain_freed_memory",
    "logger",
)
NEVER = (
    "model",
    "optim.name",
    "task.name",
    "task.teacher",
    "task.teacher_model",
    "task.teacher_layer",
    "data.name",
    "data.num_classes",
    "data.in_channels",
)
ABSENT = "<absent>"


def _matches(key, names):
    return any(key == n or key.startswith(n + ".") for n in names)


def flatten(node, prefix=""):
    """{dotted key: value} of a nested dict (lists stay values)."""
    out = {}
    for k, v in node.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _same(a, b):
    if (
        isinstance(a, (int, float))
        and isinstance(b, (int, float))
        and not isinstance(a, bool)
        and not isinstance(b, bool)
    ):
        return float(a) == float(b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def config_changes(stored, current):
    """{"allowed", "refused", "never"}: lists of (key, checkpoint value, new value); "unrecorded": keys."""
    old, new = flatten(stored), flatten(current)
    out = {"allowed": [], "refused": [], "never": [], "unrecorded": []}
    for key in sorted(set(old) | set(new)):
        if key not in old:
            out["unrecorded"].append(key)
            continue
        a, b = old[key], new.get(key, ABSENT)
        if _same(a, b):
            continue
        kind = "never" if _matches(key, NEVER) else "allowed" if _matches(key, MAY_CHANGE) else "refused"
        out[kind].append((key, a, b))
    return out


def describe(changes):
    return ", ".join(f"{k}={b} (the checkpoint's: {a})" for k, a, b in changes)


def check_changes(changes, source, override):
    """ConfigError for a NEVER change, or for other changes without trainer.resume_override=true."""
    fresh = "start a fresh run dir (hydra.run.dir=...)"
    if changes["never"]:
        raise ConfigError(
            f"{source} cannot be resumed with {describe(changes['never'])}: the checkpoint's weights "
            f"and optimizer state belong to the old value(s), so they cannot change on resume (not "
            f"even with trainer.resume_override=true); resume with the checkpoint's values, or {fresh}."
        )
    if changes["refused"] and not override:
        keys = ", ".join(k for k, _, _ in changes["refused"])
        raise ConfigError(
            f"{source} was trained with other settings ({keys} differ): {describe(changes['refused'])}. "
            f"A resume may change only {', '.join(MAY_CHANGE)}. Resume with the checkpoint's values, "
            f"{fresh}, or pass trainer.resume_override=true to apply the new values from the resume "
            f"point on (logged, and recorded in config.yaml and the checkpoints)."
        )


def _history(run_dir, ckpt_dir):
    found = []
    best = os.path.join(ckpt_dir, "best.pt")
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if os.path.isfile(best):
        found.append(best)
    if os.path.isfile(metrics) and os.path.getsize(metrics) > 0:
        found.append(metrics)
    return found


def choose_resume(resume, run_dir, ckpt_dir):
    """(checkpoint path or None, note for the log or None); ConfigError for a run dir whose history has no last.pt.

    ``resume`` is trainer.resume (None or a path).
    """
    own = os.path.abspath(os.path.join(ckpt_dir, "last.pt"))
    given = os.path.abspath(str(resume)) if resume else None
    if given and os.path.isdir(given):  # a run dir: its latest state
        given = os.path.join(given, "checkpoints", "last.pt")
    if os.path.isfile(own):
        note = None
        if given and given != own:
            note = (
                f"the run dir's own {own} wins over trainer.resume={resume}: resuming the run's latest state "
                f"(to start from {resume} instead, use a fresh run dir)"
            )
        return own, note
    if given:
        return given, None
    history = _history(run_dir, ckpt_dir)
    if history:
        best = os.path.join(ckpt_dir, "best.pt")
        resume_best = f"resume from the best epoch with trainer.resume={best}, " if best in history else ""
        raise ConfigError(
            f"the run dir {run_dir} holds a run's history ({', '.join(history)}) but no "
            f"checkpoints/last.pt, so starting here would overwrite it; {resume_best}start in a fresh "
            f"dir with hydra.run.dir=..., or delete {' and '.join(history)} to start over here."
        )
    return None, None


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


@dataclasses.dataclass
class Progress:
    """Where a run is (what every checkpoint records): epochs done, steps into the next one (a mid-epoch
    checkpoint), the best validation top-1 and its epoch, and every finished epoch's record."""

    epoch: int = 0
    step: int = 0
    best_top1: float = -1.0
    best_epoch: int = 0
    history: list = dataclasses.field(default_factory=list)


def resume_path(cfg, run_dir, ckpt_dir):
    """The checkpoint to resume from, or None (rank 0 decides, every rank gets its answer; choose_resume's rules)."""
    answer = None
    if dist.is_main():
        try:
            answer = (*choose_resume(cfg.trainer.resume, run_dir, ckpt_dir), None)
        except ConfigError as e:
            answer = (None, None, str(e))
    path, note, error = dist.broadcast_object(answer)
    if error:
        raise ConfigError(error)
    if note:
        log.warning(note)
    return path


def _load_state(obj, state, what, path):
    """``obj.load_state_dict(state)`` with a one-line CheckpointError instead of torch's KeyError/ValueError."""
    try:
        obj.load_state_dict(state)
    except (KeyError, ValueError, TypeError, RuntimeError, IndexError, AttributeError) as e:
        raise CheckpointError(
            f"{path}: its {what} state does not fit this run's {what} "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else e}); resume with the "
            f"run's own settings, or start a fresh run dir."
        ) from None


def _check_optimizer_kind(saved, optimizer, path):
    """The saved param groups must have this optimizer's hyperparameters (SGD's momentum vs AdamW's betas)."""
    groups = saved["param_groups"]
    mine = {k for k in optimizer.param_groups[0] if k not in ("params", "initial_lr")}
    theirs = (
        {k for k in groups[0] if k not in ("params", "initial_lr")} if groups and isinstance(groups[0], dict) else set()
    )
    if len(groups) != len(optimizer.param_groups) or mine - theirs:
        raise CheckpointError(
            f"{path} holds the state of another optimizer ({len(groups)} parameter group(s) "
            f"with {', '.join(sorted(theirs)) or 'no settings'}) than this run's "
            f"{type(optimizer).__name__} ({len(optimizer.param_groups)} group(s)); the optimizer "
            f"cannot change on resume: use the run's optim=..., or start a fresh run dir."
        )


@dataclasses.dataclass
class Resumed:
    """What a checkpoint gives the run that resumes it (the driver applies it)."""

    state: dict  # the loop position and history: the fields of Progress
    rng: object  # this rank's RNG states for a mid-epoch resume on the same number of processes, else None
    scheduler: object  # the schedule to continue with (rebuilt when trainer.epochs or optim/sched changed)


def restore(path, cfg, *, model, task, optimizer, scheduler, scaler, sums, ema, train_dataset, device, world, rank):
    """Load last.pt into the given model, task, weight average, optimizer, scheduler, scaler and sums; returns
    a Resumed with the loop state, this rank's RNG states and the schedule to use.

    ``cfg`` is compared with the checkpoint's config first (config_changes): a difference that may not change
    is refused before anything is loaded.
    """
    ckpt = check_training_checkpoint(load_checkpoint(path, map_location=device), path)
    changes = _check_config(ckpt, cfg, path, train_dataset)
    _load_model(ckpt, cfg, path, model, task, ema)
    _check_optimizer_kind(ckpt["optimizer"], optimizer, path)
    settings = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    _load_state(optimizer, ckpt["optimizer"], "optimizer", path)
    _load_state(scheduler, ckpt["scheduler"], "scheduler", path)
    _load_state(scaler, ckpt["scaler"], "GradScaler", path)
    _load_state(sums, ckpt["train_sums"], "metric sums", path)
    state = {f.name: ckpt[f.name] for f in dataclasses.fields(Progress)}
    step, same_world = state["step"], ckpt["world_size"] == world
    if step and not same_world:
        log.warning(
            "mid-epoch checkpoint from %d process(es) resumed on %d: the rest of the epoch continues "
            "at step %d of the new data split (not bit-exact)",
            ckpt["world_size"],
            world,
            step,
        )
    log.info(
        "resumed from %s: %d epoch(s) done%s", path, state["epoch"], f", {step} step(s) into the next" if step else ""
    )
    scheduler = _apply_changes(changes, ckpt["config"], cfg, path, state, optimizer, settings, scheduler)
    return Resumed(state, ckpt["rng"][rank] if step and same_world else None, scheduler)


def _check_config(ckpt, cfg, path, train_dataset):
    """The checkpoint's config against ``cfg`` (config_changes) and its classes against the data; the changes."""
    stored, fix = ckpt["config"], "resume with the run's own settings, or start a fresh run dir (hydra.run.dir=...)"
    check_stored_model(cfg, stored, path, ("name", "layer"), fix)
    changes = config_changes(stored, OmegaConf.to_container(cfg, resolve=True))
    changes["override"] = bool(cfg.trainer.resume_override)
    check_changes(changes, path, changes["override"])
    check_classes(ckpt.get("classes"), train_dataset, f"{path}", fix)
    return changes


def _load_model(ckpt, cfg, path, model, task, ema):
    """The model's, the task's and the weight average's states from the checkpoint."""
    load_weights(
        model,
        ckpt["model"],
        source=path,
        hint=f"(built from model.name={cfg.model.name} model.layer={cfg.model.layer}; resume with the "
        f"run's own model and data settings, or start a fresh run dir)",
    )
    task_state = ckpt.get("task", {})
    if not isinstance(task_state, dict):
        raise CheckpointError(
            f"{path}: its task field must be a dict of state_dicts, found "
            f"{type(task_state).__name__}; resume from an intact copy or start a fresh run dir."
        )
    task.load_extra_state_dicts(task_state, source=path)
    if ema is not None and ckpt.get("ema"):
        _load_state(ema, ckpt["ema"], "weight average (trainer.ema_decay)", path)
    elif ema is not None:
        log.warning("%s holds no weight average: trainer.ema_decay starts one from the resumed weights", path)


def _apply_changes(changes, stored, cfg, path, state, optimizer, settings, scheduler):
    """Apply the allowed setting changes from the resume point on (logged); returns the schedule to continue."""
    applied = changes["allowed"] + (changes["refused"] if changes["override"] else [])
    if applied:
        log.warning("settings changed on resume, applied from here on: %s", describe(applied))
    if changes["unrecorded"]:
        log.info(
            "not recorded in %s (an option newer than the checkpoint), taken as given: %s",
            path,
            ", ".join(changes["unrecorded"]),
        )
    changed = {k for k, _, _ in applied}
    if any(k.startswith(("optim.", "sched.")) for k in changed):
        for group, mine in zip(optimizer.param_groups, settings):
            group.update(mine)  # optimizer.load_state_dict restored the checkpoint's lr, weight decay, ...
    if state["step"] and "data.batch_size" in changed:
        old, step = int(stored["data"]["batch_size"]), state["step"]
        state["step"] = step * old // int(cfg.data.batch_size)
        log.warning(
            "data.batch_size changed from %d to %d mid-epoch: the epoch continues after the %d images it "
            "already trained on, at step %d",
            old,
            int(cfg.data.batch_size),
            step * old,
            state["step"],
        )
    planned, epochs = stored.get("trainer", {}).get("epochs", int(cfg.trainer.epochs)), int(cfg.trainer.epochs)
    if planned != epochs or any(k.startswith(("optim.", "sched.")) for k in changed):
        return reschedule(cfg, optimizer, scheduler, state["epoch"], planned)
    return scheduler


def reschedule(cfg, optimizer, scheduler, epoch, planned):
    """A resumed run with a new trainer.epochs: the schedule of a run planned for the new length, at ``epoch``.

    The learning rate from here on is what a run started with the new trainer.epochs would have at the
    same epoch (e.g. cosine: eta_min + (lr - eta_min) * (1 + cos(pi * epoch / new_epochs)) / 2), so
    extending a finished 2-epoch cosine run to 3 trains epoch 3 at lr/4, not at 0. Returns the schedule
    to continue with (``scheduler`` itself when nothing is left to train).
    """
    epochs = int(cfg.trainer.epochs)
    if epoch >= epochs:
        log.warning("the checkpoint already has %d epoch(s), trainer.epochs=%d: nothing left to train", epoch, epochs)
        return scheduler
    for group in optimizer.param_groups:
        group["lr"] = group["initial_lr"]
    scheduler = build_scheduler(cfg.sched, optimizer, epochs)
    with warnings.catch_warnings():  # "scheduler.step() before optimizer.step()": replaying, not training
        warnings.simplefilter("ignore", UserWarning)
        for _ in range(epoch):
            scheduler.step()
    why = (
        f"trainer.epochs changed from {planned} (the checkpoint's) to {epochs}"
        if planned != epochs
        else "optim/sched settings changed (trainer.resume_override=true)"
    )
    log.warning(
        "%s: the %s schedule is recomputed for %d epochs and continues at epoch %d with lr %.6g",
        why,
        cfg.sched.name,
        epochs,
        epoch + 1,
        optimizer.param_groups[0]["lr"],
    )
    return scheduler
