# ruff: noqa
# fmt: off
"""A DCGAN trained the PyTorch 0.3 way (legacy idioms, unedited by design).

Re-creates, in our own words, the idioms of pytorch/examples ``dcgan/main.py`` as of March
2018 (BSD-3-Clause): preallocated ``input``/``noise``/``label`` tensors refilled with
``resize_``/``fill_``, ``Variable(label.fill_(fake_label))``, ``errD = errD_real +
errD_fake`` printed as ``errD.data[0]``, ``D_x = output.data.mean()``, a ``weights_init``
that matches class names, a generator whose forward tests
``isinstance(input.data, torch.cuda.FloatTensor)``. Random 16x16 images stand in for a
dataset.
"""
from __future__ import print_function

import argparse
import json

import torch
import torch.nn as nn
import torch.nn.parallel
import torch.optim as optim
import torch.utils.data
from torch.autograd import Variable

parser = argparse.ArgumentParser()
parser.add_argument('--batchSize', type=int, default=8)
parser.add_argument('--batches', type=int, default=4)
parser.add_argument('--niter', type=int, default=1)
parser.add_argument('--nz', type=int, default=8)
parser.add_argument('--ngf', type=int, default=8)
parser.add_argument('--ndf', type=int, default=8)
parser.add_argument('--lr', type=float, default=0.0002)
parser.add_argument('--beta1', type=float, default=0.5)
parser.add_argument('--manualSeed', type=int, default=7)
opt = parser.parse_args()

torch.manual_seed(opt.manualSeed)
images = torch.rand(opt.batchSize * opt.batches, 1, 16, 16) * 2 - 1
dataloader = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(images, torch.zeros(len(images))),
    batch_size=opt.batchSize, shuffle=True)

ngpu = 1
nz, ngf, ndf, nc = opt.nz, opt.ngf, opt.ndf, 1


# custom weights initialization called on netG and netD
def weights_init(m):
    classname = m.__class__.__name__
    if classname.find('Conv') != -1:
        m.weight.data.normal_(0.0, 0.02)
    elif classname.find('BatchNorm') != -1:
        m.weight.data.normal_(1.0, 0.02)
        m.bias.data.fill_(0)


class _netG(nn.Module):
    def __init__(self, ngpu):
        super(_netG, self).__init__()
        self.ngpu = ngpu
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 2, 4, 1, 0, bias=False),
            nn.BatchNorm2d(ngf * 2),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False),
            nn.Tanh()
        )

    def forward(self, input):
        if isinstance(input.data, torch.cuda.FloatTensor) and self.ngpu > 1:
            output = nn.parallel.data_parallel(self.main, input, range(self.ngpu))
        else:
            output = self.main(input)
        return output


class _netD(nn.Module):
    def __init__(self, ngpu):
        super(_netD, self).__init__()
        self.ngpu = ngpu
        self.main = nn.Sequential(
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 2),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, 1, 4, 1, 0, bias=False),
            nn.Sigmoid()
        )

    def forward(self, input):
        output = self.main(input)
        return output.view(-1, 1).squeeze(1)


netG = _netG(ngpu)
netG.apply(weights_init)
netD = _netD(ngpu)
netD.apply(weights_init)

criterion = nn.BCELoss()

input = torch.FloatTensor(opt.batchSize, 1, 16, 16)
noise = torch.FloatTensor(opt.batchSize, nz, 1, 1)
fixed_noise = torch.FloatTensor(opt.batchSize, nz, 1, 1).normal_(0, 1)
label = torch.FloatTensor(opt.batchSize)
real_label = 1
fake_label = 0

fixed_noise = Variable(fixed_noise)

optimizerD = optim.Adam(netD.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))
optimizerG = optim.Adam(netG.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))

losses = []
for epoch in range(opt.niter):
    for i, data in enumerate(dataloader, 0):
        # (1) Update D network: maximize log(D(x)) + log(1 - D(G(z)))
        netD.zero_grad()
        real_cpu, _ = data
        batch_size = real_cpu.size(0)
        input.resize_as_(real_cpu).copy_(real_cpu)
        label.resize_(batch_size).fill_(real_label)
        inputv = Variable(input)
        labelv = Variable(label)

        output = netD(inputv)
        errD_real = criterion(output, labelv)
        errD_real.backward()
        D_x = output.data.mean()

        noise.resize_(batch_size, nz, 1, 1).normal_(0, 1)
        noisev = Variable(noise)
        fake = netG(noisev)
        labelv = Variable(label.fill_(fake_label))
        output = netD(fake.detach())
        errD_fake = criterion(output, labelv)
        errD_fake.backward()
        D_G_z1 = output.data.mean()
        errD = errD_real + errD_fake
        optimizerD.step()

        # (2) Update G network: maximize log(D(G(z)))
        netG.zero_grad()
        labelv = Variable(label.fill_(real_label))  # fake labels are real for generator cost
        output = netD(fake)
        errG = criterion(output, labelv)
        errG.backward()
        D_G_z2 = output.data.mean()
        optimizerG.step()

        print('[%d/%d][%d/%d] Loss_D: %.4f Loss_G: %.4f D(x): %.4f D(G(z)): %.4f / %.4f'
              % (epoch, opt.niter, i, len(dataloader),
                 errD.data[0], errG.data[0], D_x, D_G_z1, D_G_z2))
        losses.append([errD.data[0], errG.data[0]])

fake = netG(fixed_noise)
print('RESULT ' + json.dumps({'losses': losses, 'fake_mean': float(fake.data.mean())}))
