# ruff: noqa
# fmt: off
"""Writes model.pth as torch 0.3 saved a style network's state_dict: InstanceNorm was a
_BatchNorm then, so each one saved running_mean/running_var, and there is no version
metadata (the checkpoint a download would have given)."""
from collections import OrderedDict

import torch

from net import TransformerNet

torch.manual_seed(4)
net = TransformerNet()
state = OrderedDict(net.state_dict())  # a plain OrderedDict: no _metadata, as 0.3 wrote
for name in ('in1', 'in2'):
    state[name + '.running_mean'] = torch.zeros(8)
    state[name + '.running_var'] = torch.ones(8)
torch.save(state, 'model.pth')
