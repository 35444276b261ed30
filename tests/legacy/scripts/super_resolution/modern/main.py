"""The super-resolution trainer of ../legacy/main.py, modernised by hand."""

import argparse
import json
from math import log10

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from model import Net
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser(description="PyTorch Super Res Example")
parser.add_argument("--upscale_factor", type=int, default=2)
parser.add_argument("--batchSize", type=int, default=8)
parser.add_argument("--nEpochs", type=int, default=2)
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--seed", type=int, default=123)
opt = parser.parse_args()

torch.manual_seed(opt.seed)
targets = torch.rand(32, 1, 16, 16)
inputs = F.avg_pool2d(targets, opt.upscale_factor)
training_data_loader = DataLoader(
    TensorDataset(inputs[:24], targets[:24]), batch_size=opt.batchSize, shuffle=True
)
testing_data_loader = DataLoader(TensorDataset(inputs[24:], targets[24:]), batch_size=4)

model = Net(upscale_factor=opt.upscale_factor)
criterion = nn.MSELoss()
optimizer = optim.Adam(model.parameters(), lr=opt.lr)
losses = []


def train(epoch):
    epoch_loss = 0
    for input, target in training_data_loader:
        optimizer.zero_grad()
        loss = criterion(model(input), target)
        epoch_loss += loss.item()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    print(f"===> Epoch {epoch} Complete: Avg. Loss: {epoch_loss / len(training_data_loader):.4f}")


def test():
    avg_psnr = 0
    with torch.no_grad():
        for input, target in testing_data_loader:
            mse = criterion(model(input), target)
            avg_psnr += 10 * log10(1 / mse.item())
    print(f"===> Avg. PSNR: {avg_psnr / len(testing_data_loader):.4f} dB")
    return avg_psnr / len(testing_data_loader)


psnrs = []
for epoch in range(1, opt.nEpochs + 1):
    train(epoch)
    psnrs.append(test())
    torch.save(model, f"model_epoch_{epoch}.pth")

print("RESULT " + json.dumps({"losses": losses, "psnr": psnrs}))
