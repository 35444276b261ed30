"""The VAE of ../legacy/main.py, modernised by hand (torch >= 1.0 idioms)."""

import argparse
import json

import torch
import torch.utils.data
from torch import nn, optim
from torch.nn import functional as F

parser = argparse.ArgumentParser(description="VAE on random images")
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--batches", type=int, default=8)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--seed", type=int, default=1)
args = parser.parse_args()

torch.manual_seed(args.seed)
images = torch.rand(args.batch_size * args.batches, 64)
train_loader = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(images, torch.zeros(len(images))),
    batch_size=args.batch_size,
    shuffle=True,
)
test_loader = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(images[:32], torch.zeros(32)), batch_size=args.batch_size
)


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 32)
        self.fc21 = nn.Linear(32, 8)
        self.fc22 = nn.Linear(32, 8)
        self.fc3 = nn.Linear(8, 32)
        self.fc4 = nn.Linear(32, 64)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        if self.training:
            std = torch.exp(0.5 * logvar)
            eps = torch.randn_like(std)
            return eps.mul(std).add_(mu)
        return mu

    def decode(self, z):
        h3 = F.relu(self.fc3(z))
        return torch.sigmoid(self.fc4(h3))

    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, 64))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


model = VAE()
optimizer = optim.Adam(model.parameters(), lr=1e-3)


def loss_function(recon_x, x, mu, logvar):
    BCE = F.binary_cross_entropy(recon_x, x.view(-1, 64), reduction="sum")
    KLD = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return BCE + KLD


losses = []


def train(epoch):
    model.train()
    train_loss = 0
    for data, _ in train_loader:
        optimizer.zero_grad()
        recon_batch, mu, logvar = model(data)
        loss = loss_function(recon_batch, data, mu, logvar)
        loss.backward()
        train_loss += loss.item()
        optimizer.step()
        losses.append(loss.item() / len(data))
    print(f"====> Epoch: {epoch} Average loss: {train_loss / len(train_loader.dataset):.4f}")


def test(epoch):
    model.eval()
    test_loss = 0
    with torch.no_grad():
        for data, _ in test_loader:
            recon_batch, mu, logvar = model(data)
            test_loss += loss_function(recon_batch, data, mu, logvar).item()
    test_loss /= len(test_loader.dataset)
    print(f"====> Test set loss: {test_loss:.4f}")
    return test_loss


for epoch in range(1, args.epochs + 1):
    train(epoch)
    test_loss = test(epoch)
    with torch.no_grad():
        sample = model.decode(torch.randn(16, 8)).cpu()

print(
    "RESULT "
    + json.dumps({"losses": losses, "test_loss": test_loss, "sample_mean": float(sample.mean())})
)
