"""VGG-small for CIFAR, as defined by LQ-Nets (Zhang et al., ECCV 2018) and used by the AdderNet paper.

Six 3x3 layers 128,128 / 256,256 / 512,512, each with BN + ReLU, a 2x2 max-pool after each pair,
and one linear classifier on the 512x4x4 map. As in the LQ-Nets code, the second layer of a pair
is pooled before its BN + ReLU. conv0 and the classifier stay multiplicative in both forms.
"""

import torch.nn as nn

from .layers import body_conv, init_weights
from .registry import register_model

WIDTHS = (128, 128, 256, 256, 512, 512)


class VGGSmall(nn.Module):
    def __init__(self, layer="adder", num_classes=10, in_channels=3):
        super().__init__()
        conv = body_conv(layer)
        self.conv0 = nn.Conv2d(in_channels, WIDTHS[0], 3, padding=1, bias=False)
        for i, (cin, cout) in enumerate(zip(WIDTHS, WIDTHS[1:]), start=1):
            self.add_module(f"conv{i}", conv(cin, cout, 3, padding=1))
        for i, width in enumerate(WIDTHS):
            self.add_module(f"bn{i}", nn.BatchNorm2d(width))
        self.pool = nn.MaxPool2d(2, 2)
        self.relu = nn.ReLU(inplace=True)
        self.fc = nn.Linear(WIDTHS[-1] * 4 * 4, num_classes)
        init_weights(self)

    def forward(self, x):
        for i in range(len(WIDTHS)):
            x = getattr(self, f"conv{i}")(x)
            if i % 2:
                x = self.pool(x)
            x = self.relu(getattr(self, f"bn{i}")(x))
        return self.fc(x.flatten(1))


@register_model("vgg_small", "CIFAR")
def vgg_small(layer="adder", num_classes=10, in_channels=3):
    return VGGSmall(layer, num_classes, in_channels)
