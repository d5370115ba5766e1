"""ResNet-20 / ResNet-32 for CIFAR, module for module the official AdderNet resnet20.py.

The official checkpoint maps onto it by stripping `module.` and renaming `.adder` to `.weight`.
Stem (3x3 conv) and classifier (1x1 conv, no bias, followed by BatchNorm2d(num_classes) `bn2`)
stay multiplicative in both forms.

The official AdderNet code and checkpoints: Copyright (C) 2020 Huawei Technologies Co., Ltd., BSD 3-Clause
(the notice is in LICENSE).
"""

import torch.nn as nn

from .blocks import BasicBlock, make_stage
from .layers import body_conv, init_weights
from .registry import register_model


class CifarResNet(nn.Module):
    def __init__(self, depth, layer="adder", num_classes=10, in_channels=3):
        super().__init__()
        if (depth - 2) % 6:
            raise ValueError(f"CIFAR ResNet depth must be 6n+2 (20, 32, 44, ...), got {depth}")
        n = (depth - 2) // 6
        conv = body_conv(layer)
        self.conv1 = nn.Conv2d(in_channels, 16, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = make_stage(conv, BasicBlock, 16, 16, n)
        self.layer2 = make_stage(conv, BasicBlock, 16, 32, n, stride=2)
        self.layer3 = make_stage(conv, BasicBlock, 32, 64, n, stride=2)
        self.avgpool = nn.AvgPool2d(8, stride=1)  # 32x32 input -> 8x8 maps -> 1x1
        self.fc = nn.Conv2d(64, num_classes, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(num_classes)
        init_weights(self, keep_default=(self.conv1, self.fc))

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        x = self.bn2(self.fc(self.avgpool(x)))
        return x.flatten(1)


@register_model("resnet20", "CIFAR")
def resnet20(layer="adder", num_classes=10, in_channels=3):
    return CifarResNet(20, layer, num_classes, in_channels)


@register_model("resnet32", "CIFAR")
def resnet32(layer="adder", num_classes=10, in_channels=3):
    return CifarResNet(32, layer, num_classes, in_channels)
