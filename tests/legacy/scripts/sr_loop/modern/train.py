"""The super-resolution training loop of ../legacy/train.py, modernised by hand."""

import json
from math import log10

import torch
import torch.nn as nn
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(9)


class Net(nn.Module):
    def __init__(self, upscale_factor=2):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, upscale_factor**2, 3, padding=1)
        self.pixel_shuffle = nn.PixelShuffle(upscale_factor)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.pixel_shuffle(self.conv2(self.relu(self.conv1(x))))


high = torch.rand(24, 1, 8, 8)
low = nn.functional.avg_pool2d(high, 2)
train_loader = DataLoader(TensorDataset(low[:16], high[:16]), batch_size=4, shuffle=True)
test_loader = DataLoader(TensorDataset(low[16:], high[16:]), batch_size=4)
model = Net()
criterion = nn.MSELoss()
optimizer = optim.Adam(model.parameters(), lr=0.01)
losses, psnrs = [], []
for epoch in range(1, 4):
    epoch_loss = 0.0
    for input, target in train_loader:
        optimizer.zero_grad()
        loss = criterion(model(input), target)
        epoch_loss += loss.item()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    print(f"===> Epoch {epoch} Complete: Avg. Loss: {epoch_loss / len(train_loader):.4f}")
    avg_psnr = 0.0
    with torch.no_grad():
        for input, target in test_loader:
            avg_psnr += 10 * log10(1 / criterion(model(input), target).item())
    psnrs.append(avg_psnr / len(test_loader))
print("RESULT " + json.dumps({"losses": losses, "psnr": psnrs}))
