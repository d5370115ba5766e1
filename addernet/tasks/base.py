"""The training-task interface: a training method is the loss of one batch plus the modules it owns.

The engine's step loop is the same for every method: it calls ``task(images, target)`` and
back-propagates ``out["loss"]``. Everything a method needs beyond the model (a teacher network, a
projection head) lives in the task, which tells the engine what to checkpoint, what to train (so
that it goes into the optimizer and DDP), and what else to evaluate every epoch. Every extra
scalar in the returned dict is averaged over the epoch and logged as ``train_<name>`` in
metrics.jsonl, ``train/<name>`` in TensorBoard and on the epoch's log line.
"""
import contextlib

import torch.nn as nn

from ..checkpoint import load_weights
from ..errors import ConfigError
from ..forward import autocast


TASKS = {}


def register_task(name):
    """Class decorator adding a TrainingTask subclass to TASKS as ``task.name=<name>`` (configs/task/<name>.yaml)."""
    def add(cls):
        if name in TASKS:
            raise ValueError(f"task {name!r} is registered twice")
        TASKS[name] = cls
        return cls

    return add


class TrainingTask:
    """Base class. Subclasses implement ``forward`` and, when they own modules, ``extra_modules``.

    ``self.model`` is the bare model (what checkpoints hold as ``model``); ``self.net`` is what to call
    in ``forward`` (the DDP wrapper under torchrun, else the model itself); ``self.cfg`` the task's
    config node (``cfg.task``); ``self.amp`` the trainer.amp setting, applied by ``self.autocast()``.
    """

    #: Extra-module names that train: they go into the optimizer, DDP, and train() mode.
    trainable = ()
    #: Keys of cfg.task this task reads beyond those of configs/task/*.yaml (unknown keys are refused).
    config_keys = ()

    def __init__(self, model, cfg, full_cfg=None):
        self.model, self.net, self.cfg, self.full_cfg = model, model, cfg, full_cfg
        self.device, self.amp = None, "off"
        self._nets = {}

    @classmethod
    def check_config(cls, cfg, full_cfg):
        """Validate ``cfg`` (the task node) before anything is built; raise ConfigError naming the key."""

    def extra_modules(self):
        """name -> nn.Module owned by the task (state saved in checkpoints under ``task``)."""
        return {}

    def eval_models(self):
        """name -> model evaluated on the validation set every epoch next to the student (``<name>_val_*``)."""
        return {}

    def setup(self, device, amp, memory_format):
        """Move the extra modules to the training device; remember the autocast setting."""
        self.device, self.amp = device, amp
        for module in self.extra_modules().values():
            module.to(device=device, memory_format=memory_format)

    def distribute(self, wrap):
        """Wrap the model and the trainable extra modules with ``wrap`` (DDP); forward calls ``self.net``."""
        self.net = wrap(self.model)
        self._nets = {name: wrap(m) for name, m in self.extra_modules().items() if name in self.trainable}

    def extra_net(self, name):
        """The callable for an extra module: its DDP wrapper when it trains under torchrun."""
        return self._nets.get(name) or self.extra_modules()[name]

    def no_sync(self):
        """DDP's no_sync on every wrapper (model and trainable extras): a micro-batch without gradient all-reduce."""
        stack = contextlib.ExitStack()
        for net in (self.net, *self._nets.values()):
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
        self.net.train(mode)
        for name, module in self.extra_modules().items():
            module.train(mode and name in self.trainable)
        return self

    def autocast(self):
        return autocast(self.device, self.amp) if self.device is not None else contextlib.nullcontext()

    def forward(self, images, target):
        """dict(loss=scalar to minimise, output=student logits N x classes, **named scalar parts)."""
        raise NotImplementedError

    @property
    def label_smoothing(self):
        """task.label_smoothing: applied to the cross-entropy on the labels (0: off)."""
        return float(self.cfg.get("label_smoothing") or 0.0)

    def __call__(self, images, target):
        return self.forward(images, target)

    def state_dict(self):
        return {name: m.state_dict() for name, m in self.extra_modules().items()}

    def load_state_dict(self, state, source="checkpoint"):
        modules = self.extra_modules()
        if set(state) != set(modules):
            raise ConfigError(f"{source} holds task state for {sorted(state)} but task={self.cfg.get('name')} "
                              f"owns {sorted(modules)}; resume with the run's own task settings.")
        for name, module in modules.items():
            load_weights(module, state[name], source=f"{source} (task module {name!r})")


def unwrap(module):
    """The bare module inside a DDP / DataParallel wrapper."""
    while isinstance(module, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        module = module.module
    return module
