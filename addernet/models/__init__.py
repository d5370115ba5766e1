"""The paper's models, each as an AdderNet (`layer="adder"`) or its CNN twin (`layer="conv"`), and
any network made of adder layers: `torchvision` (any torchvision classifier, adderized) and `vit`.

In the paper's models the first convolution and the classifier are multiplicative; every other
convolution (shortcut projections included) is the body layer chosen by `layer`, followed by BN.
"""

import importlib
import inspect
import pkgutil

import torch.nn as nn
from omegaconf import OmegaConf

from ..errors import ConfigError
from ..ops import ADDER_MODULES
from .adderize import AdderizeReport, adderize
from .attention import AdderAttention
from .layers import LAYERS
from .registry import MODELS, register_model
from .tv import torchvision_model
from .vit import vit

# every module of this package is imported, so a module with a @register_model constructor is a model
for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

# dataset family -> (configs/data/<name>.yaml, input side) the family's models are made for
NATIVE_DATA = {"CIFAR": ("cifar10", 32), "MNIST": ("mnist", 28), "ImageNet": ("imagenet", 224)}


def list_models():
    """Names accepted by build_model, sorted."""
    return sorted(MODELS)


def build_model(name, layer="adder", num_classes=10, in_channels=None, **options):
    """Build model `name` with adder (`layer="adder"`) or convolution (`layer="conv"`) body layers.

    `in_channels=None` takes the model's dataset default (1 for lenet5_bn, else 3); `options` are the
    model's own keyword arguments (configs/model/<name>.yaml keys other than name and layer). An adder form
    without any adder layer (every candidate kept or left multiplicative) is a ValueError saying what it holds.
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}: choose one of {', '.join(sorted(MODELS))} (e.g. model=resnet20)")
    if layer not in LAYERS:
        raise ValueError(f"unknown layer {layer!r} for model {name!r}: use model.layer=adder or model.layer=conv")
    for arg, value in (("num_classes", num_classes), ("in_channels", in_channels)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{arg} must be a positive integer, got {value!r}")
    fn, _, default_in = MODELS[name]
    accepted = set(inspect.signature(fn).parameters) - {"layer", "num_classes", "in_channels"}
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise ValueError(
            f"model {name!r} has no option {', '.join(unknown)} (its options: {', '.join(sorted(accepted)) or 'none'})"
        )
    model = fn(layer=layer, num_classes=num_classes, in_channels=in_channels or default_in, **options)
    if layer == "adder" and not has_adder_ops(model):
        raise ValueError(f"model {name!r} with layer=adder has no adder layer: {_what_was_found(model)}")
    return model


def has_adder_ops(model):
    """True when some layer of `model` computes with additions (an adder layer or L1 / adder attention)."""
    return any(
        isinstance(m, ADDER_MODULES) or isinstance(m, AdderAttention) and (m.scores == "l1" or m.value == "adder")
        for m in model.modules()
    )


def _what_was_found(model):
    """What an adder model without adder layers holds, and how to get some (the error of build_model)."""
    kinds = {}
    for m in model.modules():
        if type(m) in (nn.Conv2d, nn.Linear):
            kinds[type(m).__name__] = kinds.get(type(m).__name__, 0) + 1
    found = ", ".join(f"{n} {k}" for k, n in kinds.items()) or "no Conv2d or Linear layer"
    report = getattr(model, "adderize_report", None)
    why = [f"{n} kept ({r})" for n, r in (report.kept if report else [])]
    why += [f"{n} skipped ({r})" for n, r in (report.skipped if report else [])]
    why += [f"{n} reverted (not called as a module)" for n, _ in (report.reverted if report else [])][:3]
    fix = (
        "convert more (model.linear=true for the Linear layers, model.keep_first=false, model.include=...)"
        if report
        else "choose some of its adder options (e.g. model.scores=l1, model.mlp=adder for vit)"
    )
    return (
        f"it has {found}"
        + (f"; {'; '.join(why)}" if why else "")
        + f". To train an AdderNet, {fix}; else use model.layer=conv"
    )


def model_label(model_cfg):
    """How logs name the model of a config: its name, the torchvision architecture it wraps, its layer form."""
    arch = model_cfg.get("arch")
    return f"{model_cfg.name}{f' {arch}' if arch else ''} ({model_cfg.layer})"


def model_from_config(cfg):
    """The model of cfg.model for the dataset of cfg.data (ConfigError on a bad name or form)."""
    options = {k: v for k, v in OmegaConf.to_container(cfg.model, resolve=True).items() if k not in ("name", "layer")}
    try:
        return build_model(
            cfg.model.name,
            layer=cfg.model.layer,
            num_classes=int(cfg.data.num_classes),
            in_channels=int(cfg.data.in_channels),
            **options,
        )
    except (KeyError, ValueError, TypeError) as e:
        msg = e.args[0] if e.args else e
        raise ConfigError(
            f"cannot build model.name={cfg.model.name!r} (model.layer={cfg.model.layer}): {msg}. "
            f"Pick a model with model=<name> (configs/model/)."
        ) from None


__all__ = [
    "MODELS",
    "LAYERS",
    "NATIVE_DATA",
    "AdderAttention",
    "AdderizeReport",
    "adderize",
    "build_model",
    "list_models",
    "model_from_config",
    "model_label",
    "register_model",
    "torchvision_model",
    "vit",
]
