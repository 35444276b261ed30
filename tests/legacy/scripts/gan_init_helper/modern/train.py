"""The GAN of ../legacy/train.py, modernised by hand (torch >= 1.0 idioms)."""

import json

import torch
import torch.nn as nn
import torch.optim as optim
from init_utils import weights_init

torch.manual_seed(3)
nz, batch = 4, 8


class G(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, 8, 4, 1, 0),
            nn.BatchNorm2d(8),
            nn.ReLU(True),
            nn.ConvTranspose2d(8, 1, 4, 2, 1),
            nn.Tanh(),
        )

    def forward(self, x):
        return self.main(x)


class D(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(1, 8, 4, 2, 1),
            nn.BatchNorm2d(8),
            nn.LeakyReLU(0.2, True),
            nn.Conv2d(8, 1, 4, 1, 0),
            nn.Sigmoid(),
        )

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
    errD_real = criterion(netD(real), torch.full((batch,), 1.0))
    errD_real.backward()
    noise = torch.empty(batch, nz, 1, 1).normal_(0, 1)
    fake = netG(noise)
    errD_fake = criterion(netD(fake.detach()), torch.full((batch,), 0.0))
    errD_fake.backward()
    errD = errD_real + errD_fake
    optD.step()
    netG.zero_grad()
    errG = criterion(netD(fake), torch.full((batch,), 1.0))
    errG.backward()
    optG.step()
    print(f"Loss_D: {errD.item():.4f} Loss_G: {errG.item():.4f}")
    losses.append([errD.item(), errG.item()])
print("RESULT " + json.dumps({"losses": losses}))
