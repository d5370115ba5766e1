"""Loading a teacher network from any checkpoint test.py can read, checked against the student's data.

Our checkpoints store their training config, so the teacher is rebuilt from its own model/data groups.
A bare state_dict (an official AdderNet file, or ``torch.save(model.state_dict())``) stores none: the
architecture comes from ``task.teacher_model`` (default: the student's) and ``task.teacher_layer``,
which must be given unless the file is in the official adder format (``.adder`` keys). Every
mismatch that would make distillation silently wrong (classes, input channels, input size) is a
ConfigError before any training step.
"""

import torch

from ..checkpoint import OFFICIAL, load_weights, read_checkpoint
from ..checkpoint.official import load_official
from ..errors import ConfigError
from ..models import model_from_config

DATA_SHAPE_KEYS = ("num_classes", "in_channels", "image_size")


def _check_data(path, stored_data, student):
    for key in DATA_SHAPE_KEYS:
        theirs, ours = stored_data.get(key), getattr(student, key)
        if theirs is not None and int(theirs) != int(ours):
            raise ConfigError(
                f"task.teacher={path} was trained with data.{key}={theirs} (data="
                f"{stored_data.get('name')}) but the student uses data.{key}={ours} (data="
                f"{student.data_name}); use a teacher trained on the student's dataset and input size."
            )


def check_teacher_fits(teacher, path, student):
    """One dry forward at the student's input shape: the teacher must give N x num_classes logits."""
    shape = (1, student.in_channels, student.image_size, student.image_size)
    try:
        with torch.no_grad():
            param = next(teacher.parameters())
            out = teacher.eval()(torch.zeros(shape, dtype=param.dtype, device=param.device)).flatten(1)
    except (RuntimeError, ValueError) as e:
        raise ConfigError(
            f"task.teacher={path} cannot take the student's inputs {tuple(shape[1:])} "
            f"(data.in_channels, data.image_size): {str(e).splitlines()[0]}"
        ) from None
    if out.shape[1] != student.num_classes:
        raise ConfigError(
            f"task.teacher={path} gives {out.shape[1]} logits but the student has data.num_classes="
            f"{student.num_classes}; use a teacher trained for the same classes."
        )


def load_teacher(cfg, student, default_layer=None):
    """The frozen teacher of ``cfg.teacher`` (eval mode, no gradients) and a one-line description.

    ``default_layer`` is the body layer assumed for a bare state_dict when task.teacher_layer is not set.
    """
    path = str(cfg.teacher)
    state, stored, kind = read_checkpoint(path)  # CheckpointError: missing, truncated, unsafe
    if stored is not None:
        if not isinstance(stored.get("model"), dict) or not isinstance(stored.get("data"), dict):
            raise ConfigError(
                f"task.teacher={path} stores no model/data config; save it as a bare state_dict and "
                f"give task.teacher_model=<name> task.teacher_layer=conv|adder."
            )
        _check_data(path, stored["data"], student)
        model_cfg = dict(stored["model"])
        for key in ("teacher_model", "teacher_layer"):
            given, own = cfg.get(key), model_cfg["name" if key == "teacher_model" else "layer"]
            if given is not None and given != own:
                raise ConfigError(
                    f"task.{key}={given} contradicts task.teacher={path}, which was trained as "
                    f"{own}; drop task.{key} (our checkpoints build their own architecture)."
                )
        tcfg = student.config_for(model_cfg)
    else:
        official_adder = any(k.endswith(".adder") for k in state)
        layer = cfg.get("teacher_layer") or default_layer or ("adder" if official_adder else None)
        if layer is None:
            raise ConfigError(
                f"task.teacher={path} is a bare state_dict with no stored config; say which network it "
                f"is with task.teacher_layer=conv|adder (and task.teacher_model=<name> if it is not "
                f"the student's model)."
            )
        name = cfg.get("teacher_model") or student.model["name"]
        # the student's own model options (model.arch, model.width, ...) when the teacher is the same model
        model = student.model if name == student.model["name"] else {}
        tcfg = student.config_for({**model, "name": name, "layer": layer})
    teacher = model_from_config(tcfg)
    hint = (
        f"(the teacher was built as model={tcfg.model.name} model.layer={tcfg.model.layer} with data.num_classes="
        f"{tcfg.data.num_classes}; for a bare state_dict set task.teacher_model / task.teacher_layer)"
    )
    (load_official if kind == OFFICIAL else load_weights)(teacher, state, source=f"task.teacher={path}", hint=hint)
    check_teacher_fits(teacher, path, student)
    teacher.requires_grad_(False)
    return teacher.eval(), f"{tcfg.model.name} ({tcfg.model.layer}) from {path} [{kind}]"
