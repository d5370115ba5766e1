"""Training methods as tasks (``task=<name>``): the loop is the same for all, a method is one module.

``build_task(model, cfg)`` picks the class named by ``cfg.task.name``: a name of TASKS (a class decorated
with ``@register_task(name)``), or a dotted path ``package.module.ClassName`` to any TrainingTask subclass
(a method kept outside the package).

base.py            TrainingTask (an nn.Module), Student (what a task knows of the model and data), register_task
classification.py  task=classification: cross-entropy on the labels
kd.py              task=kd: logit distillation from a frozen teacher
pkkd.py            task=pkkd: kernel-based progressive distillation with a co-trained CNN twin
kernel_maps.py     PKKD's kernel maps of a layer's (input patch, filter) pairs, from the layer output
teacher.py         a teacher loaded from any checkpoint test.py reads, checked against the student's data
"""

import importlib
import pkgutil

from ..errors import ConfigError
from .base import TASKS, Student, TrainingTask, register_task, unwrap
from .classification import ClassificationTask
from .kd import KDTask
from .pkkd import PKKDTask

# every module of this package is imported, so a module with a @register_task class is a training method
for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")


def task_class(name):
    """The TrainingTask subclass for ``task.name`` (ConfigError listing the known names)."""
    if name in TASKS:
        return TASKS[name]
    module, _, attr = str(name).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), attr) if module else None
    except (ImportError, AttributeError):
        cls = None
    if not (isinstance(cls, type) and issubclass(cls, TrainingTask)):
        raise ConfigError(
            f"task.name={name!r} is not a training task; choose task=<one of "
            f"{', '.join(TASKS)}> or give the dotted path of a TrainingTask subclass."
        )
    return cls


def build_task(model, cfg):
    """The task of ``cfg.task`` around ``model`` (validated first), told what it needs of cfg.model and cfg.data."""
    cls, student = task_class(cfg.task.name), Student.from_config(cfg)
    cls.check_config(cfg.task, student)
    return cls(model, cfg.task, student)


__all__ = [
    "TASKS",
    "ClassificationTask",
    "KDTask",
    "PKKDTask",
    "Student",
    "TrainingTask",
    "build_task",
    "register_task",
    "task_class",
    "unwrap",
]
