"""LeNet-5-BN for MNIST: the classic LeNet-5 with BatchNorm after each convolution.

Input is the native 1x28x28 MNIST image; conv1 pads by 2, which is exactly the classic net's
zero-padded 32x32 input (so the maps are 6x28x28 -> 14x14 -> 16x10x10 -> 5x5 as in LeNet-5), then
the fully connected layers 400-120-84-classes.

`adder_layers` says which layers `layer` applies to:
- "body" (default): conv2 only; conv1 and the fully connected layers stay multiplicative, the rule
  every model of this repository follows (stem and classifier multiplicative, as in the official code).
- "all": the paper's MNIST network (Sec. 4.1: "about 870K additions and almost no multiplication",
  twice its CNN's multiply-accumulates): every convolution and every fully connected layer is `layer`,
  and each fully connected layer is followed by BatchNorm1d, as each convolution is by BatchNorm2d.
  An adder layer's outputs are large and all negative (-sum |x - w|), so every adder layer needs a
  normalisation after it; the last one (fc3 -> bn5) is the official ResNets' classifier rule, a 1x1
  layer followed by BatchNorm over the classes. With layer="conv" this gives the all-adder network's
  twin of identical structure.
"""

import functools

import torch.nn as nn

from ..ops import AdderLinear
from .layers import body_conv, init_weights
from .registry import register_model

ADDER_LAYERS = ("body", "all")


class LeNet5BN(nn.Module):
    def __init__(self, layer="adder", num_classes=10, in_channels=1, adder_layers="body"):
        super().__init__()
        if adder_layers not in ADDER_LAYERS:
            raise ValueError(
                f"unknown adder_layers {adder_layers!r}: use one of {', '.join(ADDER_LAYERS)} "
                "(model.adder_layers=body: conv2 only; all: every convolution and fully connected layer)"
            )
        conv = body_conv(layer)
        every = adder_layers == "all"
        stem = conv if every else functools.partial(nn.Conv2d, bias=False)
        self.conv1 = stem(in_channels, 6, 5, padding=2)
        self.bn1 = nn.BatchNorm2d(6)
        self.conv2 = conv(6, 16, 5)
        self.bn2 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        self.pool = nn.MaxPool2d(2, 2)
        if every:
            fc = AdderLinear if layer == "adder" else nn.Linear
            self.fc1, self.bn3 = fc(16 * 5 * 5, 120, bias=False), nn.BatchNorm1d(120)
            self.fc2, self.bn4 = fc(120, 84, bias=False), nn.BatchNorm1d(84)
            self.fc3, self.bn5 = fc(84, num_classes, bias=False), nn.BatchNorm1d(num_classes)
        else:
            self.fc1, self.bn3 = nn.Linear(16 * 5 * 5, 120), nn.Identity()
            self.fc2, self.bn4 = nn.Linear(120, 84), nn.Identity()
            self.fc3, self.bn5 = nn.Linear(84, num_classes), nn.Identity()
        init_weights(self)

    def forward(self, x):
        x = self.pool(self.relu(self.bn1(self.conv1(x))))
        x = self.pool(self.relu(self.bn2(self.conv2(x))))
        x = self.relu(self.bn3(self.fc1(x.flatten(1))))
        x = self.relu(self.bn4(self.fc2(x)))
        return self.bn5(self.fc3(x))


@register_model("lenet5_bn", "MNIST", in_channels=1)
def lenet5_bn(layer="adder", num_classes=10, in_channels=1, adder_layers="body"):
    return LeNet5BN(layer, num_classes, in_channels, adder_layers)
