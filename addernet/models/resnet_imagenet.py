"""ResNet-18 / ResNet-50 for ImageNet in the torchvision layout (stride on the 3x3 of a bottleneck).

Module names follow the official AdderNet resnet50.py, so its checkpoint maps by stripping
`module.` and renaming `.adder` to `.weight`. Stem (7x7 conv) and classifier (1x1 conv with bias,
followed by BatchNorm2d(num_classes) `bn2`) stay multiplicative in both forms; ResNet-18 (no
official code) is the same recipe with basic blocks.

The official AdderNet code and checkpoints: Copyright (C) 2020 Huawei Technologies Co., Ltd., BSD 3-Clause
(the notice is in LICENSE).
"""

import torch.nn as nn

from .blocks import BasicBlock, Bottleneck, make_stage
from .layers import body_conv, init_weights
from .registry import register_model


class ImageNetResNet(nn.Module):
    def __init__(self, block, layers, layer="adder", num_classes=1000, in_channels=3):
        super().__init__()
        conv = body_conv(layer)
        self.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        inplanes = 64
        for i, (planes, blocks) in enumerate(zip((64, 128, 256, 512), layers)):
            stage = make_stage(conv, block, inplanes, planes, blocks, stride=1 if i == 0 else 2)
            self.add_module(f"layer{i + 1}", stage)
            inplanes = planes * block.expansion
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Conv2d(inplanes, num_classes, 1)
        self.bn2 = nn.BatchNorm2d(num_classes)
        init_weights(self)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = self.bn2(self.fc(self.avgpool(x)))
        return x.flatten(1)


@register_model("resnet18", "ImageNet")
def resnet18(layer="adder", num_classes=1000, in_channels=3):
    return ImageNetResNet(BasicBlock, [2, 2, 2, 2], layer, num_classes, in_channels)


@register_model("resnet50", "ImageNet")
def resnet50(layer="adder", num_classes=1000, in_channels=3):
    return ImageNetResNet(Bottleneck, [3, 4, 6, 3], layer, num_classes, in_channels)
