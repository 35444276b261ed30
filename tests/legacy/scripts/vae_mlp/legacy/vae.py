# ruff: noqa
# fmt: off
"""A fully connected VAE on binary vectors, PyTorch 0.3 style (legacy idioms, unedited by
design).

Re-creates, in our own words, the idioms of 2017-2018 VAE tutorials: ``reparameterize``
with ``std.data.new(std.size()).normal_()`` wrapped in a ``Variable``, a loss function
summing ``F.binary_cross_entropy(..., size_average=False)`` and the KL term, ``train_loss +=
loss.data[0]``, and a log line of ``kld.data.numpy()[0]``. Random binary vectors stand in
for MNIST.
"""
import json

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import optim
from torch.autograd import Variable

torch.manual_seed(6)


class VAE(nn.Module):
    def __init__(self):
        super(VAE, self).__init__()
        self.fc1 = nn.Linear(16, 12)
        self.fc21 = nn.Linear(12, 3)
        self.fc22 = nn.Linear(12, 3)
        self.fc3 = nn.Linear(3, 12)
        self.fc4 = nn.Linear(12, 16)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        if self.training:
            std = logvar.mul(0.5).exp_()
            eps = Variable(std.data.new(std.size()).normal_())
            return eps.mul(std).add_(mu)
        return mu

    def decode(self, z):
        return F.sigmoid(self.fc4(F.relu(self.fc3(z))))

    def forward(self, x):
        mu, logvar = self.encode(x)
        return self.decode(self.reparameterize(mu, logvar)), mu, logvar


def loss_function(recon_x, x, mu, logvar):
    bce = F.binary_cross_entropy(recon_x, x, size_average=False)
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return bce + kld, kld


model = VAE()
optimizer = optim.Adam(model.parameters(), lr=1e-2)
data = torch.bernoulli(torch.rand(5, 8, 16))
losses, klds = [], []
for epoch in range(3):
    model.train()
    train_loss = 0
    for batch in data:
        x = Variable(batch)
        optimizer.zero_grad()
        recon, mu, logvar = model(x)
        loss, kld = loss_function(recon, x, mu, logvar)
        loss.backward()
        train_loss += loss.data[0]
        optimizer.step()
        klds.append(float(kld.data.numpy()[0]))
    print('epoch %d loss %.4f KLD %.4f' % (epoch, train_loss / 40, kld.data.numpy()[0]))
    losses.append(train_loss / 40)
print('RESULT ' + json.dumps({'losses': losses, 'kld': klds}))
