"""Residual blocks shared by the CIFAR and ImageNet ResNets (official AdderNet module names)."""

import torch.nn as nn


class BasicBlock(nn.Module):
    """Two 3x3 body convolutions, stride on the first; BN after each; ReLU after bn1 and the sum."""

    expansion = 1

    def __init__(self, conv, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = conv(inplanes, planes, 3, stride=stride, padding=1)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv(planes, planes, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """1x1 - 3x3 - 1x1 with the stride on the 3x3 (torchvision / official resnet50.py layout)."""

    expansion = 4

    def __init__(self, conv, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = conv(inplanes, planes, 1)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv(planes, planes, 3, stride=stride, padding=1)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = conv(planes, planes * self.expansion, 1)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


RESIDUAL_BLOCKS = (BasicBlock, Bottleneck)


def make_stage(conv, block, inplanes, planes, blocks, stride=1):
    """A stage of `blocks` blocks; a 1x1 body-conv + BN shortcut only where the shape changes."""
    downsample = None
    if stride != 1 or inplanes != planes * block.expansion:
        downsample = nn.Sequential(
            conv(inplanes, planes * block.expansion, 1, stride=stride), nn.BatchNorm2d(planes * block.expansion)
        )
    layers = [block(conv, inplanes, planes, stride, downsample)]
    layers += [block(conv, planes * block.expansion, planes) for _ in range(1, blocks)]
    return nn.Sequential(*layers)
