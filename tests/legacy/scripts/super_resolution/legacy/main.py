# ruff: noqa
# fmt: off
"""Sub-pixel super-resolution trained the PyTorch 0.3 way (legacy idioms, unedited by design).

Re-creates, in our own words, the idioms of pytorch/examples ``super_resolution``
(``main.py``, ``model.py``, ``super_resolve.py``) as of March 2018 (BSD-3-Clause):
``init.orthogonal`` without the underscore, ``epoch_loss += loss.data[0]``, PSNR from
``10 * log10(1 / mse.data[0])``, and a whole-model checkpoint per epoch
(``torch.save(model, path)``) that super_resolve.py reloads with ``torch.load`` and calls.
Random 16x16 images (and their 8x8 averages as input) stand in for BSDS300.
"""
from __future__ import print_function

import argparse
import json
from math import log10

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.autograd import Variable
from torch.utils.data import DataLoader, TensorDataset

from model import Net

parser = argparse.ArgumentParser(description='PyTorch Super Res Example')
parser.add_argument('--upscale_factor', type=int, default=2)
parser.add_argument('--batchSize', type=int, default=8)
parser.add_argument('--nEpochs', type=int, default=2)
parser.add_argument('--lr', type=float, default=0.01)
parser.add_argument('--seed', type=int, default=123)
opt = parser.parse_args()

torch.manual_seed(opt.seed)

targets = torch.rand(32, 1, 16, 16)
inputs = F.avg_pool2d(targets, opt.upscale_factor)
training_data_loader = DataLoader(TensorDataset(inputs[:24], targets[:24]),
                                  batch_size=opt.batchSize, shuffle=True)
testing_data_loader = DataLoader(TensorDataset(inputs[24:], targets[24:]), batch_size=4)

print('===> Building model')
model = Net(upscale_factor=opt.upscale_factor)
criterion = nn.MSELoss()
optimizer = optim.Adam(model.parameters(), lr=opt.lr)
losses = []


def train(epoch):
    epoch_loss = 0
    for iteration, batch in enumerate(training_data_loader, 1):
        input, target = Variable(batch[0]), Variable(batch[1])

        optimizer.zero_grad()
        loss = criterion(model(input), target)
        epoch_loss += loss.data[0]
        loss.backward()
        optimizer.step()
        losses.append(loss.data[0])

        print("===> Epoch[{}]({}/{}): Loss: {:.4f}".format(
            epoch, iteration, len(training_data_loader), loss.data[0]))

    print("===> Epoch {} Complete: Avg. Loss: {:.4f}".format(
        epoch, epoch_loss / len(training_data_loader)))


def test():
    avg_psnr = 0
    for batch in testing_data_loader:
        input, target = Variable(batch[0]), Variable(batch[1])

        prediction = model(input)
        mse = criterion(prediction, target)
        psnr = 10 * log10(1 / mse.data[0])
        avg_psnr += psnr
    print("===> Avg. PSNR: {:.4f} dB".format(avg_psnr / len(testing_data_loader)))
    return avg_psnr / len(testing_data_loader)


def checkpoint(epoch):
    model_out_path = "model_epoch_{}.pth".format(epoch)
    torch.save(model, model_out_path)
    print("Checkpoint saved to {}".format(model_out_path))


psnrs = []
for epoch in range(1, opt.nEpochs + 1):
    train(epoch)
    psnrs.append(test())
    checkpoint(epoch)

print('RESULT ' + json.dumps({'losses': losses, 'psnr': psnrs}))
