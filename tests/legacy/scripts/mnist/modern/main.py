"""The convnet of ../legacy/main.py, modernised by hand (torch >= 1.0 idioms)."""

import argparse
import json

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser(description="convnet on random digits")
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--batches", type=int, default=6)
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--momentum", type=float, default=0.5)
parser.add_argument("--seed", type=int, default=1)
args = parser.parse_args()

torch.manual_seed(args.seed)
n = args.batch_size * args.batches
images = torch.randn(n, 1, 28, 28)
labels = (images[:, 0, 14, :10] > 0).long().sum(1)
labels = labels.clamp(max=9)
train_loader = DataLoader(TensorDataset(images, labels), batch_size=args.batch_size, shuffle=True)
test_loader = DataLoader(TensorDataset(images[:64], labels[:64]), batch_size=args.batch_size)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


model = Net()
optimizer = optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
losses = []


def train(epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        print(
            f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_loader.dataset)}]"
            f"\tLoss: {loss.item():.6f}"
        )


def test():
    model.eval()
    test_loss = 0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            pred = output.argmax(dim=1, keepdim=True)
            correct += pred.eq(target.view_as(pred)).sum().item()
    test_loss /= len(test_loader.dataset)
    print(
        f"Test set: Average loss: {test_loss:.4f}, Accuracy: {correct}/{len(test_loader.dataset)}"
    )
    return test_loss, correct


for epoch in range(1, args.epochs + 1):
    train(epoch)
    test_loss, correct = test()

print("RESULT " + json.dumps({"losses": losses, "test_loss": test_loss, "correct": int(correct)}))
