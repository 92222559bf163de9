"""A package the test Ray cluster's nodes can import (tests/raynet.py puts this folder on their
PYTHONPATH) and the tests' stepbench clients cannot: `--model nodes_only_net:make` is read and
imported where the setups run."""

import torch
from torch import nn


def make(batch_size, device, *, depth=1):
    x = torch.randn(batch_size, 8, device=device)
    body = [nn.Linear(8, 16), nn.ReLU()] + [nn.Linear(16, 16)] * (depth - 1) + [nn.Linear(16, 1)]
    net = nn.Sequential(*body)
    return Loss(net), lambda: x


class Loss(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net(x).pow(2).mean()
