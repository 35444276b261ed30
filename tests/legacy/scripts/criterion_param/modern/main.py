"""The train/evaluate helpers of ../legacy/main.py, modernised by hand."""

import json

import torch
import torch.nn as nn
import torch.optim as optim


def train(model, criterion, optimizer, batches):
    model.train()
    total_loss = 0.0
    for x, y in batches:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        total_loss += loss.item() * len(x)
    return total_loss / sum(len(x) for x, _ in batches)


@torch.no_grad()
def evaluate(model, criterion, batches):
    model.eval()
    total_loss = 0.0
    for x, y in batches:
        total_loss += criterion(model(x), y).item() * len(x)
    return total_loss / sum(len(x) for x, _ in batches)


torch.manual_seed(2)
w = torch.randn(5, 1)
xs = torch.randn(6, 10, 5)
batches = [(x, x.mm(w) + 0.1 * torch.randn(10, 1)) for x in xs]
model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 1))
optimizer = optim.SGD(model.parameters(), lr=0.05)
criterion = nn.MSELoss()
losses, val = [], []
for _ in range(5):
    losses.append(train(model, criterion, optimizer, batches[:4]))
    val.append(evaluate(model, nn.L1Loss(), batches[4:]))
print("RESULT " + json.dumps({"losses": losses, "val": val}))
