# ruff: noqa
# fmt: off
"""A small conv GAN, PyTorch 0.3 style, whose init helper lives in another file (legacy idioms,
unedited by design).

Re-creates, in our own words, a pattern of 2017-2018 GAN repositories (a ``weights_init``
in a utility module that writes ``m.bias.data`` of every conv; discriminator convs followed
by BatchNorm; ``Variable`` inputs and labels; ``errD.data[0]`` in the log). Random 8x8
images stand in for a dataset.
"""
import json

import torch
import torch.nn as nn
import torch.optim as optim
from torch.autograd import Variable

from init_utils import weights_init

torch.manual_seed(3)
nz, batch = 4, 8


class G(nn.Module):
    def __init__(self):
        super(G, self).__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, 8, 4, 1, 0), nn.BatchNorm2d(8), nn.ReLU(True),
            nn.ConvTranspose2d(8, 1, 4, 2, 1), nn.Tanh())

    def forward(self, x):
        return self.main(x)


class D(nn.Module):
    def __init__(self):
        super(D, self).__init__()
        self.main = nn.Sequential(
            nn.Conv2d(1, 8, 4, 2, 1), nn.BatchNorm2d(8), nn.LeakyReLU(0.2, True),
            nn.Conv2d(8, 1, 4, 1, 0), nn.Sigmoid())

    def forward(self, x):
        return self.main(x).view(-1, 1).squeeze(1)


netG, netD = G(), D()
netG.apply(weights_init)
netD.apply(weights_init)
criterion = nn.BCELoss()
optD = optim.Adam(netD.parameters(), lr=0.0002, betas=(0.5, 0.999))
optG = optim.Adam(netG.parameters(), lr=0.0002, betas=(0.5, 0.999))
data = torch.tanh(torch.randn(6, batch, 1, 8, 8))
losses = []
for real in data:
    netD.zero_grad()
    label = Variable(torch.FloatTensor(batch).fill_(1))
    errD_real = criterion(netD(Variable(real)), label)
    errD_real.backward()
    noise = Variable(torch.FloatTensor(batch, nz, 1, 1).normal_(0, 1))
    fake = netG(noise)
    label = Variable(torch.FloatTensor(batch).fill_(0))
    errD_fake = criterion(netD(fake.detach()), label)
    errD_fake.backward()
    errD = errD_real + errD_fake
    optD.step()
    netG.zero_grad()
    label = Variable(torch.FloatTensor(batch).fill_(1))
    errG = criterion(netD(fake), label)
    errG.backward()
    optG.step()
    print('Loss_D: %.4f Loss_G: %.4f' % (errD.data[0], errG.data[0]))
    losses.append([errD.data[0], errG.data[0]])
print('RESULT ' + json.dumps({'losses': losses}))
