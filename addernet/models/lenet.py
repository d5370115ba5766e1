"""LeNet-5-BN for MNIST: the classic LeNet-5 with BatchNorm after each convolution.

Input is the native 1x28x28 MNIST image; conv1 pads by 2, which is exactly the classic net's
zero-padded 32x32 input (so the maps are 6x28x28 -> 14x14 -> 16x10x10 -> 5x5 as in LeNet-5).
conv1 and the fully connected layers (400-120-84-classes) stay multiplicative; conv2 is the body.
"""

import torch.nn as nn

from .layers import body_conv, init_weights
from .registry import register_model


class LeNet5BN(nn.Module):
    def __init__(self, layer="adder", num_classes=10, in_channels=1):
        super().__init__()
        conv = body_conv(layer)
        self.conv1 = nn.Conv2d(in_channels, 6, 5, padding=2, bias=False)
        self.bn1 = nn.BatchNorm2d(6)
        self.conv2 = conv(6, 16, 5)
        self.bn2 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        self.pool = nn.MaxPool2d(2, 2)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)
        init_weights(self)

    def forward(self, x):
        x = self.pool(self.relu(self.bn1(self.conv1(x))))
        x = self.pool(self.relu(self.bn2(self.conv2(x))))
        x = self.relu(self.fc1(x.flatten(1)))
        x = self.relu(self.fc2(x))
        return self.fc3(x)


@register_model("lenet5_bn", "MNIST", in_channels=1)
def lenet5_bn(layer="adder", num_classes=10, in_channels=1):
    return LeNet5BN(layer, num_classes, in_channels)
