"""Optimizers and learning-rate schedules by name, each config group validated before anything is built.

``build_optimizer(cfg.optim, param_groups)`` and ``build_scheduler(cfg.sched, optimizer, epochs)``;
``check_optim(cfg.optim)`` / ``check_sched(cfg.sched)`` raise ConfigError naming the key and the fix.
Every schedule is stepped once per epoch (after validation), so a resumed run restores it exactly.

sgd:    the paper's SGD (lr, momentum, weight_decay, nesterov).
adamw:  torch.optim.AdamW (lr, betas, eps, weight_decay).
cosine:         per-epoch cosine from optim.lr to sched.eta_min over the run (the paper's).
cosine_warmup:  linear warm-up from optim.lr * sched.warmup_start over sched.warmup_epochs, then cosine.
step:           multiply by sched.gamma every sched.step_size epochs.
multistep:      multiply by sched.gamma at each epoch in sched.milestones.
"""

import torch

from ..checks import number as _number
from ..errors import ConfigError

OPTIMIZERS = ("sgd", "adamw")
SCHEDULERS = ("cosine", "cosine_warmup", "step", "multistep")


def _name(node, group, known):
    name = node.get("name")
    if name not in known:
        raise ConfigError(
            f"{group}.name={name!r} is not known; choose one of: {', '.join(known)} "
            f"({group}=<name> selects configs/{group}/<name>.yaml)."
        )
    return name


def number(node, group, key, **kw):
    return _number(node, key, f"{group}.{key}", **kw)


def check_optim(node):
    name = _name(node, "optim", OPTIMIZERS)
    number(node, "optim", "lr", positive=True)
    number(node, "optim", "weight_decay")
    if name == "sgd":
        momentum = number(node, "optim", "momentum")
        if node.nesterov and momentum == 0:
            raise ConfigError(
                "optim.nesterov=true needs optim.momentum > 0 (Nesterov momentum without momentum "
                "is undefined); set optim.momentum=0.9 or optim.nesterov=false."
            )
    else:
        betas = node.get("betas")
        if betas is None or len(betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas):
            raise ConfigError(
                f"optim.betas must be two numbers in [0, 1), got {betas!r}; e.g. optim.betas=[0.9,0.999]."
            )
        number(node, "optim", "eps", positive=True)
    return name


def check_sched(node, epochs):
    name = _name(node, "sched", SCHEDULERS)
    if name in ("cosine", "cosine_warmup"):
        number(node, "sched", "eta_min")
    if name == "cosine_warmup":
        warmup = number(node, "sched", "warmup_epochs", integer=True)
        if warmup >= epochs:
            raise ConfigError(f"sched.warmup_epochs={warmup} must be below trainer.epochs={epochs}.")
        start = number(node, "sched", "warmup_start", positive=True)
        if start > 1:
            raise ConfigError(
                f"sched.warmup_start={start} must be in (0, 1]: the warm-up starts at optim.lr * "
                f"sched.warmup_start and rises to optim.lr; e.g. sched.warmup_start=0.1."
            )
    if name in ("step", "multistep"):
        number(node, "sched", "gamma", positive=True)
    if name == "step":
        number(node, "sched", "step_size", minimum=1, integer=True)
    if name == "multistep":
        milestones = node.get("milestones")
        if (
            milestones is None
            or not all(isinstance(m, int) and m >= 1 for m in milestones)
            or list(milestones) != sorted(milestones)
        ):
            raise ConfigError(
                f"sched.milestones must be increasing epoch numbers >= 1, got {milestones!r}; "
                f"e.g. sched.milestones=[200,300]."
            )
    return name


def build_optimizer(node, param_groups):
    """The optimizer of ``node`` (cfg.optim) over ``param_groups`` (parameters or group dicts)."""
    name = check_optim(node)
    if name == "sgd":
        return torch.optim.SGD(
            param_groups,
            lr=float(node.lr),
            momentum=float(node.momentum),
            weight_decay=float(node.weight_decay),
            nesterov=bool(node.nesterov),
        )
    return torch.optim.AdamW(
        param_groups,
        lr=float(node.lr),
        betas=tuple(float(b) for b in node.betas),
        eps=float(node.eps),
        weight_decay=float(node.weight_decay),
    )


def build_scheduler(node, optimizer, epochs):
    """The per-epoch schedule of ``node`` (cfg.sched) for a run of ``epochs`` epochs."""
    name, S = check_sched(node, epochs), torch.optim.lr_scheduler
    if name == "cosine":
        return S.CosineAnnealingLR(optimizer, T_max=int(epochs), eta_min=float(node.eta_min))
    if name == "cosine_warmup":
        warmup = int(node.warmup_epochs)
        if warmup == 0:
            return S.CosineAnnealingLR(optimizer, T_max=int(epochs), eta_min=float(node.eta_min))
        return S.SequentialLR(
            optimizer,
            [
                S.LinearLR(optimizer, start_factor=float(node.warmup_start), end_factor=1.0, total_iters=warmup),
                S.CosineAnnealingLR(optimizer, T_max=int(epochs) - warmup, eta_min=float(node.eta_min)),
            ],
            milestones=[warmup],
        )
    if name == "step":
        return S.StepLR(optimizer, step_size=int(node.step_size), gamma=float(node.gamma))
    return S.MultiStepLR(optimizer, milestones=list(node.milestones), gamma=float(node.gamma))
