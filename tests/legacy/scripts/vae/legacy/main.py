# ruff: noqa
# fmt: off
"""A variational autoencoder trained the PyTorch 0.3 way (legacy idioms, unedited by design).

Re-creates, in our own words, the idioms of pytorch/examples ``vae/main.py`` as of March
2018 (BSD-3-Clause): a loss function of the script returning ``BCE + KLD`` with
``size_average=False``, ``train_loss += loss.data[0]``, ``loss_function(...).data[0]`` in a
test loop under ``Variable(data, volatile=True)``, noise drawn with
``Variable(std.data.new(std.size()).normal_())``. Random 8x8 "images" stand in for MNIST.
"""
from __future__ import print_function

import argparse
import json

import torch
import torch.utils.data
from torch import nn, optim
from torch.autograd import Variable
from torch.nn import functional as F

parser = argparse.ArgumentParser(description='VAE on random images')
parser.add_argument('--batch-size', type=int, default=16)
parser.add_argument('--batches', type=int, default=8)
parser.add_argument('--epochs', type=int, default=2)
parser.add_argument('--seed', type=int, default=1)
args = parser.parse_args()

torch.manual_seed(args.seed)
images = torch.rand(args.batch_size * args.batches, 64)
train_loader = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(images, torch.zeros(len(images))),
    batch_size=args.batch_size, shuffle=True)
test_loader = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(images[:32], torch.zeros(32)), batch_size=args.batch_size)


class VAE(nn.Module):
    def __init__(self):
        super(VAE, self).__init__()
        self.fc1 = nn.Linear(64, 32)
        self.fc21 = nn.Linear(32, 8)
        self.fc22 = nn.Linear(32, 8)
        self.fc3 = nn.Linear(8, 32)
        self.fc4 = nn.Linear(32, 64)
        self.relu = nn.ReLU()
        self.sigmoid = nn.Sigmoid()

    def encode(self, x):
        h1 = self.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        if self.training:
            std = logvar.mul(0.5).exp_()
            eps = Variable(std.data.new(std.size()).normal_())
            return eps.mul(std).add_(mu)
        else:
            return mu

    def decode(self, z):
        h3 = self.relu(self.fc3(z))
        return self.sigmoid(self.fc4(h3))

    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, 64))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


model = VAE()
optimizer = optim.Adam(model.parameters(), lr=1e-3)


def loss_function(recon_x, x, mu, logvar):
    BCE = F.binary_cross_entropy(recon_x, x.view(-1, 64), size_average=False)
    # KL divergence of N(mu, sigma) from N(0, 1), see Kingma and Welling, Appendix B
    KLD = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return BCE + KLD


losses = []


def train(epoch):
    model.train()
    train_loss = 0
    for batch_idx, (data, _) in enumerate(train_loader):
        data = Variable(data)
        optimizer.zero_grad()
        recon_batch, mu, logvar = model(data)
        loss = loss_function(recon_batch, data, mu, logvar)
        loss.backward()
        train_loss += loss.data[0]
        optimizer.step()
        losses.append(loss.data[0] / len(data))
    print('====> Epoch: {} Average loss: {:.4f}'.format(
          epoch, train_loss / len(train_loader.dataset)))


def test(epoch):
    model.eval()
    test_loss = 0
    for i, (data, _) in enumerate(test_loader):
        data = Variable(data, volatile=True)
        recon_batch, mu, logvar = model(data)
        test_loss += loss_function(recon_batch, data, mu, logvar).data[0]

    test_loss /= len(test_loader.dataset)
    print('====> Test set loss: {:.4f}'.format(test_loss))
    return test_loss


for epoch in range(1, args.epochs + 1):
    train(epoch)
    test_loss = test(epoch)
    sample = Variable(torch.randn(16, 8))
    sample = model.decode(sample).cpu()

print('RESULT ' + json.dumps({'losses': losses, 'test_loss': test_loss,
                              'sample_mean': float(sample.data.mean())}))
