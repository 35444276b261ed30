# ruff: noqa
# fmt: off
"""A small style-transfer network with InstanceNorm, in the shape of 2017 fast neural style."""
import torch
import torch.nn as nn


class TransformerNet(nn.Module):
    def __init__(self):
        super(TransformerNet, self).__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.in1 = nn.InstanceNorm2d(8, affine=True)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.in2 = nn.InstanceNorm2d(8, affine=True)
        self.conv3 = nn.Conv2d(8, 3, 3, padding=1)
        self.relu = nn.ReLU()

    def forward(self, x):
        y = self.relu(self.in1(self.conv1(x)))
        y = self.relu(self.in2(self.conv2(y)))
        return self.conv3(y)
