"""The DCGAN of ../legacy/main.py, modernised by hand (torch >= 1.0 idioms)."""

import argparse
import json

import torch
import torch.nn as nn
import torch.optim as optim
import torch.utils.data

parser = argparse.ArgumentParser()
parser.add_argument("--batchSize", type=int, default=8)
parser.add_argument("--batches", type=int, default=4)
parser.add_argument("--niter", type=int, default=1)
parser.add_argument("--nz", type=int, default=8)
parser.add_argument("--ngf", type=int, default=8)
parser.add_argument("--ndf", type=int, default=8)
parser.add_argument("--lr", type=float, default=0.0002)
parser.add_argument("--beta1", type=float, default=0.5)
parser.add_argument("--manualSeed", type=int, default=7)
opt = parser.parse_args()

torch.manual_seed(opt.manualSeed)
images = torch.rand(opt.batchSize * opt.batches, 1, 16, 16) * 2 - 1
dataloader = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(images, torch.zeros(len(images))),
    batch_size=opt.batchSize,
    shuffle=True,
)

nz, ngf, ndf, nc = opt.nz, opt.ngf, opt.ndf, 1


def weights_init(m):
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        nn.init.normal_(m.weight, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        nn.init.normal_(m.weight, 1.0, 0.02)
        nn.init.zeros_(m.bias)


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 2, 4, 1, 0, bias=False),
            nn.BatchNorm2d(ngf * 2),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False),
            nn.Tanh(),
        )

    def forward(self, input):
        return self.main(input)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 2),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, 1, 4, 1, 0, bias=False),
            nn.Sigmoid(),
        )

    def forward(self, input):
        return self.main(input).view(-1, 1).squeeze(1)


netG = Generator()
netG.apply(weights_init)
netD = Discriminator()
netD.apply(weights_init)

criterion = nn.BCELoss()
fixed_noise = torch.randn(opt.batchSize, nz, 1, 1)
real_label = 1.0
fake_label = 0.0

optimizerD = optim.Adam(netD.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))
optimizerG = optim.Adam(netG.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))

losses = []
for epoch in range(opt.niter):
    for i, (real, _) in enumerate(dataloader, 0):
        netD.zero_grad()
        batch_size = real.size(0)
        label = torch.full((batch_size,), real_label)
        output = netD(real)
        errD_real = criterion(output, label)
        errD_real.backward()
        D_x = output.mean().item()

        noise = torch.randn(batch_size, nz, 1, 1)
        fake = netG(noise)
        label.fill_(fake_label)
        output = netD(fake.detach())
        errD_fake = criterion(output, label)
        errD_fake.backward()
        D_G_z1 = output.mean().item()
        errD = errD_real + errD_fake
        optimizerD.step()

        netG.zero_grad()
        label.fill_(real_label)
        output = netD(fake)
        errG = criterion(output, label)
        errG.backward()
        D_G_z2 = output.mean().item()
        optimizerG.step()

        print(
            f"[{epoch}/{opt.niter}][{i}/{len(dataloader)}] Loss_D: {errD.item():.4f} "
            f"Loss_G: {errG.item():.4f} D(x): {D_x:.4f} D(G(z)): {D_G_z1:.4f} / {D_G_z2:.4f}"
        )
        losses.append([errD.item(), errG.item()])

with torch.no_grad():
    fake = netG(fixed_noise)
print("RESULT " + json.dumps({"losses": losses, "fake_mean": float(fake.mean())}))
