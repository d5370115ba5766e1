"""Kernel-based progressive distillation (PKKD, Xu et al., NeurIPS 2020) as a task: ``task=pkkd``.

The student is the AdderNet; the teacher is its CNN twin (same model, model.layer=conv), by default
initialised fresh and trained at the same time ("progressive"), or a frozen pretrained checkpoint
(``task.teacher=PATH``: the ablation). Per batch, both networks see the same images and

    L_student = CE(z_a, y) + kd_weight * T^2 KL(softmax(z_c/T) || softmax(z_a/T)) + feature_weight * mean_m L_m
    L_m       = mean (rho_m(g_m) - h_m)^2,   g_m = exp(Y_a / sigma_a)  (Laplacian kernel of the adder layer)
                                             h_m = exp(-||x - w||^2 / 2 sigma_c^2)  (Gaussian kernel of the conv layer)
    L_teacher = CE(z_c, y) [+ kd_weight * T^2 KL(softmax(z_a/T) || softmax(z_c/T)) with teacher_loss=dml]

with every teacher tensor detached in L_student and every student tensor detached in L_teacher, so one
backward of L_student + L_teacher gives each network exactly its own gradients (the same as two
optimizers with the same recipe). rho_m is a 1x1 conv (identity init, no bias) on the student side that
exists only here (checkpointed under ``task``, never in the student's state_dict). The kernel widths
come from detached running means of the distances (addernet/tasks/kernel_maps.py), all-reduced under
torchrun so every rank uses the same widths. The adaptive LR is attached to the student model only,
so it never touches rho or the teacher. Which choices are ours and not the paper's: docs/distillation.md.
"""

import contextlib
import logging

import torch
import torch.nn as nn
import torch.nn.functional as F
from omegaconf import OmegaConf

from .. import distributed as dist
from ..checks import choice, number
from ..errors import ConfigError
from ..models import model_from_config
from ..ops import ADDER_MODULES, Adder2d
from .base import TrainingTask, register_task
from .kd import batch_top1, check_teacher_path, check_temperature, kd_term
from .kernel_maps import conv_sq_distance, full, gaussian_kernel, laplacian_kernel
from .teacher import check_teacher_fits, load_teacher

log = logging.getLogger("addernet.train")
COTRAIN = "cotrain"
TINY = 1e-6  # kernel values below this count as underflowed (logged as kernel_tiny_*)


class KernelHead(nn.Module):
    """The maps rho_m (1x1 conv C -> C; identity init, no bias by default) and each layer's running distance scale."""

    def __init__(self, channels, momentum, init="identity", bias=False):
        super().__init__()
        self.momentum = float(momentum)
        self.rho = nn.ModuleList(nn.Conv2d(c, c, 1, bias=bias) for c in channels)
        with torch.no_grad():
            for conv, c in zip(self.rho, channels):
                if init == "identity":  # "default" keeps PyTorch's Conv2d init
                    conv.weight.copy_(torch.eye(c).view(c, c, 1, 1))
                if conv.bias is not None:
                    conv.bias.zero_()
        self.register_buffer("student_scale", torch.ones(len(channels)))
        self.register_buffer("teacher_scale", torch.ones(len(channels)))
        self.register_buffer("updates", torch.zeros((), dtype=torch.long))

    def forward(self, maps):
        return [rho(m) for rho, m in zip(self.rho, maps)]

    @torch.no_grad()
    def update(self, student_means, teacher_means):
        """EMA of the batch means (the first batch sets them); on the device, no host sync."""
        first, m = self.updates == 0, self.momentum
        for buf, new in ((self.student_scale, student_means), (self.teacher_scale, teacher_means)):
            buf.copy_(torch.where(first, new, (1 - m) * buf + m * new))
        self.updates += 1


def layer_order(teacher, names, student):
    """(name, output H x W) of the conv layers ``names`` in execution order: one dry forward at the input size."""
    order, handles = [], []
    modules = dict(teacher.named_modules())
    for name in names:
        handles.append(
            modules[name].register_forward_hook(
                lambda m, i, o, name=name: order.append((name, tuple(o.shape[2:]))) if name not in dict(order) else None
            )
        )
    was_training = teacher.training
    try:
        check_teacher_fits(teacher, "(the CNN twin)", student)
    finally:
        for h in handles:
            h.remove()
        teacher.train(was_training)
    return order


def select_layers(order, which):
    """all: every matched layer; stage_last: the last layer of each run of layers with the same output size."""
    if which == "all":
        return [n for n, _ in order]
    if which == "stage_last":
        return [n for i, (n, hw) in enumerate(order) if i + 1 == len(order) or order[i + 1][1] != hw]
    unknown = [n for n in which if n not in dict(order)]
    if unknown:
        raise ConfigError(
            f"task.layers names {unknown} that are not adder layers of the student; use all, stage_last "
            f"or a list of: {', '.join(n for n, _ in order)}."
        )
    return [n for n, _ in order if n in set(which)]


def twin_layers(student, teacher, model_name):
    """Names of the student's adder layers, each checked to be an nn.Conv2d of the same shape in the teacher."""
    adders = [(n, m) for n, m in student.named_modules() if isinstance(m, Adder2d)]
    if not adders and any(isinstance(m, ADDER_MODULES) for m in student.modules()):
        raise ConfigError(
            f"task=pkkd matches Adder2d layers with their conv twins, but the adder layers of "
            f"model={model_name} are AdderLinear / adder attention, which it does not distil yet; use "
            f"task=kd with the twin as teacher."
        )
    if not adders:
        raise ConfigError(
            f"task=pkkd needs an AdderNet student but model={model_name} has no adder layers; use "
            f"model.layer=adder (task=kd distils into a CNN)."
        )
    modules = dict(teacher.named_modules())
    keys = ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups")
    for name, adder in adders:
        conv = modules.get(name)
        if not isinstance(conv, nn.Conv2d) or any(
            _as_tuple(getattr(conv, k)) != _as_tuple(getattr(adder, k)) for k in keys
        ):
            raise ConfigError(
                f"task=pkkd: the teacher has no conv twin of the student's adder layer {name!r} (found "
                f"{type(conv).__name__}); the teacher must be model={model_name} model.layer=conv."
            )
    return [n for n, _ in adders]


def _as_tuple(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v,)


@register_task("pkkd")
class PKKDTask(TrainingTask):
    """AdderNet student distilled from its CNN twin: labels + teacher logits + kernel-mapped layer outputs."""

    @classmethod
    def check_config(cls, cfg, student):
        if student.model["layer"] != "adder":
            raise ConfigError(
                f"task=pkkd distils a CNN into an AdderNet, but model.layer={student.model['layer']} "
                f"builds no adder layers; use model.layer=adder (task=kd distils into a CNN)."
            )
        check_teacher_path(cfg, allowed=(COTRAIN,))
        check_temperature(cfg)
        for key in ("kd_weight", "feature_weight"):
            number(cfg, key, f"task.{key}")
        number(cfg, "sigma_scale", "task.sigma_scale", positive=True)
        if not 0 < number(cfg, "sigma_momentum", "task.sigma_momentum", positive=True) <= 1:
            raise ConfigError(f"task.sigma_momentum must be in (0, 1], got {cfg.sigma_momentum}.")
        choice(cfg, "teacher_loss", "task.teacher_loss", ("ce", "dml"))
        choice(cfg, "kernel", "task.kernel", (True, False))
        choice(cfg, "rho_side", "task.rho_side", ("student", "teacher"))
        choice(cfg, "rho_init", "task.rho_init", ("identity", "default"))
        choice(cfg, "rho_bias", "task.rho_bias", (True, False))
        layers = cfg.get("layers")
        if not (layers in ("all", "stage_last") or OmegaConf.is_list(layers) and len(layers) > 0):
            raise ConfigError(
                f"task.layers={layers!r} is not valid; use all, stage_last or a list of adder layer "
                f"names, e.g. task.layers=[layer3.2.conv2]."
            )
        if cfg.teacher != COTRAIN and cfg.teacher_loss != "ce":
            raise ConfigError(
                f"task.teacher_loss={cfg.teacher_loss} trains the teacher, but task.teacher="
                f"{cfg.teacher} is frozen; use task.teacher=cotrain or task.teacher_loss=ce."
            )

    def __init__(self, model, cfg, student, teacher=None):
        """``teacher`` (optional) replaces the CNN twin built from the config: for programmatic use and tests."""
        super().__init__(model, cfg, student)
        self.cotrain = cfg.teacher == COTRAIN
        model_name = student.model["name"]
        if teacher is not None:
            desc = f"{type(teacher).__name__} (given)"
        elif self.cotrain:
            twin = student.config_for({**student.model, "layer": "conv"})
            teacher, desc = model_from_config(twin), f"{model_name} (conv), fresh, co-trained"
        else:
            teacher, desc = load_teacher(cfg, student, default_layer="conv")
        self.teacher = teacher
        if not self.cotrain:
            teacher.requires_grad_(False)
        self.trainable = ("teacher", "rho") if self.cotrain else ("rho",)
        names = twin_layers(model, teacher, model_name)
        order = layer_order(teacher, names, student)
        self.layers = select_layers(order, cfg.layers if isinstance(cfg.layers, str) else list(cfg.layers))
        student_modules, teacher_modules = dict(model.named_modules()), dict(teacher.named_modules())
        self.rho = KernelHead(
            [student_modules[n].out_channels for n in self.layers], cfg.sigma_momentum, cfg.rho_init, bool(cfg.rho_bias)
        )
        self._capturing, self._student, self._teacher = False, {}, {}
        for name in self.layers:
            student_modules[name].register_forward_hook(self._keep(self._student, name, with_input=False))
            teacher_modules[name].register_forward_hook(self._keep(self._teacher, name, with_input=True))
        self._teacher_convs = [teacher_modules[n] for n in self.layers]
        log.info(
            "pkkd teacher %s | %d of %d adder layers matched (%s) | kernel %s | T=%g kd_weight=%g "
            "feature_weight=%g sigma_scale=%g teacher_loss=%s",
            desc,
            len(self.layers),
            len(names),
            cfg.layers,
            cfg.kernel,
            cfg.temperature,
            cfg.kd_weight,
            cfg.feature_weight,
            cfg.sigma_scale,
            cfg.teacher_loss,
        )

    def _keep(self, store, name, with_input):
        def hook(module, inputs, output):
            if self._capturing:  # the raw layer output (conv_sq_distance removes a conv bias itself)
                if with_input:
                    store[name] = (inputs[0], output)
                else:
                    store[name] = output if module.bias is None else output - module.bias.view(1, -1, 1, 1)

        return hook

    def eval_models(self):
        return {"teacher": self.teacher}

    def _features(self):
        """(feature loss, parts): kernel maps of the matched layers, rho on the student side, mean MSE over layers."""
        kernel, scale = bool(self.cfg.kernel), float(self.cfg.sigma_scale)
        student = [self._student[n] for n in self.layers]
        with torch.no_grad():
            if kernel:  # squared L2 distances of the conv layers; the adder layers' L1 distances are -Y
                teacher = [
                    conv_sq_distance(x, y, conv)
                    for (x, y), conv in zip((self._teacher[n] for n in self.layers), self._teacher_convs)
                ]
            else:  # plain features: the raw outputs, each divided by its running mean magnitude
                teacher = [full(self._teacher[n][1]) for n in self.layers]
            means = torch.stack([full(y).abs().mean() for y in student] + [t.abs().mean() for t in teacher])
            if dist.is_distributed():
                means = dist.all_reduce_sum(means) / dist.get_world_size()
            self.rho.update(*means.split(len(student)))
            if kernel:
                targets = [gaussian_kernel(d, scale * s) for d, s in zip(teacher, self.rho.teacher_scale)]
            else:
                targets = [t / s for t, s in zip(teacher, self.rho.teacher_scale)]
        if kernel:
            inputs = [laplacian_kernel(y, scale * s) for y, s in zip(student, self.rho.student_scale)]
        else:
            inputs = [full(y) / s for y, s in zip(student, self.rho.student_scale)]
        student_kernels, teacher_kernels = [g.detach() for g in inputs], targets
        with torch.autocast(inputs[0].device.type, enabled=False):  # rho on the student side (default) or the teacher's
            if self.cfg.rho_side == "student":
                inputs = self.extra_net("rho")(inputs)
            else:
                targets = self.extra_net("rho")(targets)
        loss = torch.stack([F.mse_loss(full(p), t) for p, t in zip(inputs, targets)]).mean()
        parts = {}
        if kernel:
            parts["kernel_tiny_student"] = torch.stack([(g < TINY).float().mean() for g in student_kernels]).mean()
            parts["kernel_tiny_teacher"] = torch.stack([(h < TINY).float().mean() for h in teacher_kernels]).mean()
        return loss, parts

    def forward(self, images, target):
        self._capturing = True
        try:
            with self.autocast(), contextlib.nullcontext() if self.cotrain else torch.no_grad():
                teacher_logits = self.extra_net("teacher")(images)
            with self.autocast():
                logits = self.net(images)
        finally:
            self._capturing = False
        logits, teacher_logits = logits.float().flatten(1), teacher_logits.float().flatten(1)
        T, kd_weight = float(self.cfg.temperature), float(self.cfg.kd_weight)
        ce = F.cross_entropy(logits, target, label_smoothing=self.label_smoothing)  # the student's CE only
        kd = kd_term(logits, teacher_logits, T)
        feature, parts = self._features()
        self._student.clear()
        self._teacher.clear()
        loss = ce + kd_weight * kd + float(self.cfg.feature_weight) * feature
        parts.update(
            ce=ce.detach(), kd=kd.detach(), feature=feature.detach(), teacher_top1=batch_top1(teacher_logits, target)
        )
        if self.cotrain:
            teacher_ce = F.cross_entropy(teacher_logits, target)
            loss = loss + teacher_ce
            parts["teacher_ce"] = teacher_ce.detach()
            if self.cfg.teacher_loss == "dml":
                dml = kd_term(teacher_logits, logits, T)
                loss = loss + kd_weight * dml
                parts["teacher_dml"] = dml.detach()
        return {"loss": loss, "output": logits, **parts}
