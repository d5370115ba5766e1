"""Any torchvision classification network as an AdderNet (``model=torchvision model.arch=<builder>``).

The network is built by torchvision without weights (``weights=None``) for ``num_classes`` classes, without
auxiliary classifiers (GoogLeNet's and Inception v3's ``aux_logits``: their training-mode outputs are not a
tensor of logits); its first convolution is rebuilt for ``in_channels`` when that is not 3; with
``layer="adder"`` it is adderized (adderize.py), with a 224x224 check pass that puts back the layers the network
does not call, and with ``layer="conv"`` it stays as torchvision builds it: the CNN twin, with the same module
names and shapes.
"""

import difflib

import torch
import torch.nn as nn
import torchvision

from ..errors import ConfigError
from .adderize import adderize
from .registry import register_model


def classification_builders():
    """Names of torchvision's classification model builders (torchvision.models.<name>)."""
    return torchvision.models.list_models(module=torchvision.models)


def _first_conv_for(model, in_channels):
    """Rebuild the first nn.Conv2d of `model` for `in_channels` inputs (same other arguments, fresh init)."""
    name, conv = next(((n, m) for n, m in model.named_modules() if type(m) is nn.Conv2d), (None, None))
    if conv is None:
        raise ValueError(f"in_channels={in_channels}: this network has no nn.Conv2d stem to adapt; use 3-channel data")
    if conv.groups != 1:
        raise ValueError(f"in_channels={in_channels}: the stem {name} is a grouped convolution; use 3-channel data")
    new = nn.Conv2d(
        in_channels,
        conv.out_channels,
        conv.kernel_size,
        stride=conv.stride,
        padding=conv.padding,
        dilation=conv.dilation,
        bias=conv.bias is not None,
        padding_mode=conv.padding_mode,
    )
    model.set_submodule(name, new)


def _build(arch, **kwargs):
    """torchvision.models.get_model(arch, weights=None, **kwargs), also under torch.device("meta") (a dry run),
    where builders that lay out their stages with tensors (RegNet) cannot compute: they are built on CPU there."""
    try:
        return torchvision.models.get_model(arch, weights=None, **kwargs)
    except NotImplementedError:
        if torch.get_default_device().type != "meta":
            raise
        with torch.device("cpu"):
            return torchvision.models.get_model(arch, weights=None, **kwargs).to("meta")


def _fixed_size(model, args):
    """torchvision's ViT asserts its input size deep inside; say it as a config error instead."""
    h, w = args[0].shape[-2:]
    if (h, w) != (model.image_size, model.image_size):
        raise ConfigError(
            f"this torchvision ViT takes {model.image_size}x{model.image_size} images only (its position "
            f"embedding is sized for them), got {h}x{w}; use data.image_size={model.image_size} or model=vit"
        )


@register_model("torchvision")
def torchvision_model(
    layer="adder",
    num_classes=10,
    in_channels=3,
    arch="resnet18",
    keep_first=True,
    keep_last=True,
    linear=False,
    include=None,
    exclude=(),
    missing_norm="warn",
):
    """torchvision.models.<arch>(weights=None, num_classes=num_classes), adderized when layer="adder";
    keep_first / keep_last / linear / include / exclude / missing_norm are adderize's switches."""
    builders = classification_builders()
    if arch not in builders:
        close = difflib.get_close_matches(str(arch), builders, n=3)
        raise ValueError(
            f"model.arch={arch!r} is not a torchvision classification model"
            + (f" (did you mean {', '.join(close)}?)" if close else "")
            + "; any name of torchvision.models.list_models(module=torchvision.models) works"
        )
    if layer not in ("adder", "conv"):
        raise ValueError(f"unknown layer {layer!r}: use model.layer=adder or model.layer=conv")
    model = _build(arch, num_classes=num_classes)
    if getattr(model, "aux_logits", False):
        model = _build(arch, num_classes=num_classes, aux_logits=False)
    if isinstance(model, torchvision.models.VisionTransformer):
        model.register_forward_pre_hook(_fixed_size)
    if in_channels != 3:
        _first_conv_for(model, in_channels)
    if layer == "adder":
        model.adderize_report = adderize(
            model,
            keep_first=keep_first,
            keep_last=keep_last,
            linear=linear,
            include=None if include is None else list(include),
            exclude=list(exclude or ()),
            missing_norm=missing_norm,
            example=(2, in_channels, 224, 224),  # every torchvision classifier takes ImageNet's size
        )
    return model
