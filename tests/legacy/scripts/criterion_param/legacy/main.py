# ruff: noqa
# fmt: off
"""A regression trained by generic train/evaluate helpers that take the criterion as a
parameter, PyTorch 0.3 style (legacy idioms, unedited by design).

Re-creates, in our own words, a pattern of 2017-2018 training utilities (``def
train(model, criterion, optimizer, loader)``, ``total_loss += loss.data[0] * len(x)``,
``evaluate`` under ``volatile=True``, a ``criterion = nn.MSELoss()`` chosen by the caller).
Random features stand in for a dataset.
"""
import json

import torch
import torch.nn as nn
import torch.optim as optim
from torch.autograd import Variable


def train(model, criterion, optimizer, batches):
    model.train()
    total_loss = 0
    for x, y in batches:
        optimizer.zero_grad()
        loss = criterion(model(Variable(x)), Variable(y))
        loss.backward()
        optimizer.step()
        total_loss += loss.data[0] * len(x)
    return total_loss / sum(len(x) for x, _ in batches)


def evaluate(model, criterion, batches):
    model.eval()
    total_loss = 0
    for x, y in batches:
        output = model(Variable(x, volatile=True))
        total_loss += criterion(output, Variable(y)).data[0] * len(x)
    return total_loss / sum(len(x) for x, _ in batches)


torch.manual_seed(2)
w = torch.randn(5, 1)
xs = torch.randn(6, 10, 5)
batches = [(x, x.mm(w) + 0.1 * torch.randn(10, 1)) for x in xs]
model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 1))
optimizer = optim.SGD(model.parameters(), lr=0.05)
criterion = nn.MSELoss()
losses, val = [], []
for epoch in range(5):
    losses.append(train(model, criterion, optimizer, batches[:4]))
    val.append(evaluate(model, nn.L1Loss(), batches[4:]))
print('RESULT ' + json.dumps({'losses': losses, 'val': val}))
