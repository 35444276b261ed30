# ruff: noqa
# fmt: off
"""A sub-pixel super-resolution net trained through a DataLoader, PyTorch 0.3 style (legacy
idioms, unedited by design).

Re-creates, in our own words, the training loop of 2017-2018 super-resolution repositories
(ESPCN with ``nn.PixelShuffle``): ``for iteration, batch in enumerate(loader, 1)`` with
``Variable(batch[0]), Variable(batch[1], requires_grad=False)``, ``epoch_loss +=
loss.data[0]`` inside the loop, a validation PSNR ``10 * log10(1 / mse.data[0])``.
Random low/high-resolution pairs stand in for BSDS300.
"""
import json
from math import log10

import torch
import torch.nn as nn
import torch.optim as optim
from torch.autograd import Variable
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(9)


class Net(nn.Module):
    def __init__(self, upscale_factor=2):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, upscale_factor ** 2, 3, padding=1)
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
    epoch_loss = 0
    for iteration, batch in enumerate(train_loader, 1):
        input, target = Variable(batch[0]), Variable(batch[1], requires_grad=False)
        optimizer.zero_grad()
        loss = criterion(model(input), target)
        epoch_loss += loss.data[0]
        loss.backward()
        optimizer.step()
        losses.append(loss.data[0])
    print("===> Epoch {} Complete: Avg. Loss: {:.4f}".format(epoch, epoch_loss / len(train_loader)))
    avg_psnr = 0
    for batch in test_loader:
        input, target = Variable(batch[0]), Variable(batch[1])
        mse = criterion(model(input), target)
        avg_psnr += 10 * log10(1 / mse.data[0])
    psnrs.append(avg_psnr / len(test_loader))
print('RESULT ' + json.dumps({'losses': losses, 'psnr': psnrs}))
