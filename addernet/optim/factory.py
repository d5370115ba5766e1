"""Optimizers and learning-rate schedules by name.

``build_optimizer(cfg.optim, param_groups)`` and ``build_scheduler(cfg.sched, optimizer, epochs)`` build from a
checked config (the values: the schema's classes, addernet/config/schema.py; the names: ``check_name``).
Every schedule is stepped once per epoch (after validation), so a resumed run restores it exactly.

sgd:    the paper's SGD (lr, momentum, weight_decay, nesterov).
adamw:  torch.optim.AdamW (lr, betas, eps, weight_decay).
cosine:         per-epoch cosine from optim.lr to sched.eta_min over the run (the paper's).
cosine_warmup:  linear warm-up from optim.lr * sched.warmup_start over sched.warmup_epochs, then cosine.
step:           multiply by sched.gamma every sched.step_size epochs.
multistep:      multiply by sched.gamma at each epoch in sched.milestones.
"""

import torch

from ..errors import ConfigError

OPTIMIZERS = ("sgd", "adamw")
SCHEDULERS = ("cosine", "cosine_warmup", "step", "multistep")


def check_name(node, group, known):
    """``node.name`` when it is one of ``known`` (OPTIMIZERS, SCHEDULERS), else ConfigError with the choices."""
    name = node.get("name")
    if name not in known:
        raise ConfigError(
            f"{group}.name={name!r} is not known; choose one of: {', '.join(known)} "
            f"({group}=<name> selects configs/{group}/<name>.yaml)."
        )
    return name


def build_optimizer(node, param_groups):
    """The optimizer of ``node`` (cfg.optim) over ``param_groups`` (parameters or group dicts)."""
    if node.name == "sgd":
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
    name, S = node.name, torch.optim.lr_scheduler
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
