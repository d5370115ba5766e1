"""The one switch between an AdderNet and its CNN twin: which layer the body convolutions use."""

import torch.nn as nn

from ..ops import Adder2d

LAYERS = ("adder", "conv")


def body_conv(layer):
    """Return a constructor (in, out, kernel_size, stride=1, padding=0) for the body convolutions.

    "adder" gives Adder2d, "conv" gives nn.Conv2d with the same arguments; both without bias,
    since every body convolution is followed by BatchNorm.
    """
    if layer not in LAYERS:
        raise ValueError(
            f"unknown layer {layer!r}: use one of {', '.join(LAYERS)} "
            "(override with model.layer=adder or model.layer=conv)"
        )
    cls = Adder2d if layer == "adder" else nn.Conv2d

    def make(in_channels, out_channels, kernel_size, stride=1, padding=0):
        return cls(in_channels, out_channels, kernel_size, stride=stride, padding=padding, bias=False)

    return make


def init_weights(model, keep_default=()):
    """BatchNorm to weight 1, bias 0; nn.Conv2d to Kaiming normal (fan_out, ReLU).

    Kaiming normal is what the official resnet50.py (and torchvision) apply to every nn.Conv2d;
    Adder2d keeps its own N(0, 1) init. Modules in `keep_default` keep PyTorch's default init
    (the official resnet20.py re-initialises only BatchNorm, so its stem and classifier do).
    """
    keep = {id(m) for m in keep_default}
    for m in model.modules():
        if id(m) in keep:
            continue
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
