"""The training-task interface: a training method is the loss of one batch plus the modules it owns.

The engine's step loop is the same for every method: it calls ``task(images, target)`` and
back-propagates ``out["loss"]``. Everything a method needs beyond the model (a teacher network, a
projection head) lives in the task, which tells the engine what to checkpoint, what to train (so
that it goes into the optimizer and DDP), and what else to evaluate every epoch. Every extra
scalar in the returned dict is averaged over the epoch and logged as ``train_<name>`` in
metrics.jsonl, ``train/<name>`` in TensorBoard and on the epoch's log line.
"""

import contextlib
import dataclasses

import torch.nn as nn
from omegaconf import OmegaConf

from ..checkpoint import load_weights
from ..errors import ConfigError
from ..forward import autocast
from ..registry import registrar

TASKS = {}


# @register_task(name): a TrainingTask subclass becomes ``task.name=<name>`` (configs/task/<name>.yaml)
register_task = registrar(TASKS, "task")


@dataclasses.dataclass(frozen=True)
class Student:
    """What a training method is told about the student and its data, instead of the whole config."""

    model: dict  # the student's model config (name, layer, options): a teacher of its architecture, a twin
    data_name: str
    num_classes: int
    in_channels: int
    image_size: int

    @classmethod
    def from_config(cls, cfg):
        d = cfg.data
        return cls(
            OmegaConf.to_container(cfg.model, resolve=True),
            str(d.name),
            int(d.num_classes),
            int(d.in_channels),
            int(d.image_size),
        )

    def config_for(self, model):
        """The config model_from_config builds ``model`` (a model config dict) from, for the student's data."""
        return OmegaConf.create(
            {
                "model": dict(model),
                "data": {
                    "name": self.data_name,
                    "num_classes": self.num_classes,
                    "in_channels": self.in_channels,
                    "image_size": self.image_size,
                },
            }
        )


class TrainingTask(nn.Module):
    """Base class. Subclasses implement ``forward`` and assign the modules they own as attributes.

    ``self.model`` is the bare model (what checkpoints hold as ``model``); ``self.net`` is what to call
    in ``forward`` (the DDP wrapper under torchrun, else the model itself); ``self.cfg`` the task's
    config node (``cfg.task``); ``self.student`` what the method knows of the student and its data;
    ``self.amp`` the trainer.amp setting, applied by ``self.autocast()``. Being an nn.Module, the task
    moves its modules with ``.to()`` and switches them with ``.train()`` / ``.eval()``.
    """

    #: Extra-module names that train: they go into the optimizer, DDP, and train() mode.
    trainable = ()
    #: Keys of cfg.task this task reads beyond those of configs/task/*.yaml (unknown keys are refused).
    config_keys = ()

    def __init__(self, model, cfg, student=None):
        super().__init__()
        self.model, self.cfg, self.student, self.amp = model, cfg, student, "off"
        self._wrapped = {}  # name -> DDP wrapper (a plain dict: not a submodule)

    @classmethod
    def check_config(cls, cfg, student):
        """The task's own rules between its keys and the student's (``student``: model and data), before anything is
        built; raise ConfigError naming the key. A value's own rule sits with its field in the task's schema class
        (addernet/config/schema.py). Called once, by addernet.engine.check_config."""

    def extra_modules(self):
        """name -> nn.Module owned by the task (state saved in checkpoints under ``task``): its submodules."""
        return {name: m for name, m in self.named_children() if name != "model"}

    def eval_models(self):
        """name -> model evaluated on the validation set every epoch next to the student (``<name>_val_*``)."""
        return {}

    def distribute(self, wrap):
        """Wrap the model and the trainable extra modules with ``wrap`` (DDP, or CudaGraphed for trainer.cuda_graph);
        forward calls ``self.net``."""
        self._wrapped = {"model": wrap(self.model)}
        self._wrapped.update({name: wrap(m) for name, m in self.extra_modules().items() if name in self.trainable})

    @property
    def net(self):
        return self._wrapped.get("model", self.model)

    def extra_net(self, name):
        """The callable for an extra module: its DDP wrapper when it trains under torchrun."""
        return self._wrapped.get(name) or self.extra_modules()[name]

    def no_sync(self):
        """DDP's no_sync on every wrapper (model and trainable extras): a micro-batch without gradient all-reduce."""
        stack = contextlib.ExitStack()
        for net in self._wrapped.values():
            if isinstance(net, nn.parallel.DistributedDataParallel):
                stack.enter_context(net.no_sync())
        return stack

    def param_groups(self):
        """Optimizer parameter groups: the model's, then each trainable extra module's (same recipe)."""
        groups = [{"params": list(self.model.parameters())}]
        groups += [{"params": list(m.parameters())} for n, m in self.extra_modules().items() if n in self.trainable]
        return groups

    def train(self, mode=True):
        """Training mode for the model and trainable extras; frozen extras always stay in eval mode."""
        super().train(mode)
        for name, module in self.extra_modules().items():
            module.train(mode and name in self.trainable)
        return self

    def autocast(self):
        """torch.autocast for trainer.amp on the model's device."""
        return autocast(next(self.model.parameters()).device, self.amp)

    def forward(self, images, target):
        """dict(loss=scalar to minimise, output=student logits N x classes, **named scalar parts)."""
        raise NotImplementedError

    @property
    def label_smoothing(self):
        """task.label_smoothing: applied to the cross-entropy on the labels (0: off)."""
        return float(self.cfg.label_smoothing)

    def extra_state_dicts(self):
        """{name: state_dict} of the extra modules: the checkpoint's ``task`` field."""
        return {name: m.state_dict() for name, m in self.extra_modules().items()}

    def load_extra_state_dicts(self, state, source="checkpoint"):
        """Load a checkpoint's ``task`` field (CheckpointError/ConfigError naming ``source`` when it does not fit)."""
        modules = self.extra_modules()
        if set(state) != set(modules):
            raise ConfigError(
                f"{source} holds task state for {sorted(state)} but task={self.cfg.get('name')} "
                f"owns {sorted(modules)}; resume with the run's own task settings."
            )
        for name, module in modules.items():
            load_weights(module, state[name], source=f"{source} (task module {name!r})")


def unwrap(module):
    """The bare module inside a DDP / DataParallel wrapper."""
    while isinstance(module, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        module = module.module
    return module
