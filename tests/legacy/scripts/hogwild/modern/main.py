"""The Hogwild training of ../legacy/main.py, modernised by hand (torch >= 1.0 idioms)."""

import json

import torch
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, kernel_size=3)
        self.fc = nn.Linear(4 * 5 * 5, 3)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        return F.log_softmax(self.fc(x.view(-1, 4 * 5 * 5)), dim=1)


def train(rank, model, data, target, queue):
    torch.set_num_threads(1)  # a forked child: OpenMP's pool of the parent is gone
    torch.manual_seed(10 + rank)
    optimizer = optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    losses = []
    for i in range(4):
        optimizer.zero_grad()
        loss = F.nll_loss(model(data[rank, i]), target[rank, i])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    queue.put(losses)


if __name__ == "__main__":
    torch.manual_seed(1)
    data = torch.randn(2, 4, 8, 1, 12, 12)
    target = torch.empty(2, 4, 8, dtype=torch.long).random_(0, 3)
    model = Net()
    model(data[0, 0])
    model.share_memory()
    queue = mp.Queue()
    losses = []
    for rank in range(2):
        p = mp.Process(target=train, args=(rank, model, data, target, queue))
        p.start()
        p.join()
        losses += queue.get(timeout=3)
    with torch.no_grad():
        test = data[:, 0].reshape(-1, 1, 12, 12)
        test_loss = F.nll_loss(model(test), target[:, 0].reshape(-1), reduction="sum").item()
    print(f"Test loss: {test_loss / 16:.4f}")
    print("RESULT " + json.dumps({"losses": losses, "test_loss": test_loss / 16}))
