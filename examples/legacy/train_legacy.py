"""Legacy-style training script: the pitfalls safetorch's monkeypatch mode fixes.

Run it under monkeypatch mode (it fails with plain ``python`` on a machine like ours):

    safetorch run examples/legacy/train_legacy.py [--workers N] [--start-method spawn]

* ``F.upsample_bilinear``: deprecated, warns on every call;
* ``model.load_state_dict(torch.load(path))`` with a checkpoint saved from ``nn.DataParallel``:
  every key starts with ``module.``, so a plain model refuses it;
* a custom batch class with ``DataLoader(pin_memory=True)``: torch leaves it unpinned, and
  warns on a machine without an accelerator;
* ``nn.SyncBatchNorm.convert_sync_batchnorm`` although no process group will ever exist.

``train_fixed.py`` is the same program fixed by hand; both print the same numbers.
"""
import argparse
import os
import tempfile
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 4, 3, padding=1)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(x, 2)
        x = F.upsample_bilinear(x, scale_factor=2)  # deprecated
        x = self.conv2(x)
        return self.head(x.mean(dim=(2, 3)))


@dataclass
class Batch:  # a custom batch type: DataLoader(pin_memory=True) does not know it
    images: torch.Tensor
    labels: torch.Tensor


def collate(samples):
    return Batch(torch.stack([s[0] for s in samples]), torch.stack([s[1] for s in samples]))


class Shapes(Dataset):
    def __init__(self, n=48):
        g = torch.Generator().manual_seed(0)
        self.images = torch.randn(n, 3, 8, 8, generator=g)
        self.labels = torch.randint(0, 3, (n,), generator=g)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i], self.labels[i]


def make_pretrained(path):
    torch.manual_seed(1)
    model = nn.DataParallel(Net())  # saved as-is: keys carry "module."
    torch.save(model.state_dict(), path)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--start-method", default=None)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    path = os.path.join(tempfile.mkdtemp(), "pretrained.pt")
    make_pretrained(path)

    torch.manual_seed(2)
    model = Net()
    model.load_state_dict(torch.load(path))
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)

    loader = DataLoader(
        Shapes(),
        batch_size=8,
        shuffle=True,
        collate_fn=collate,
        pin_memory=True,
        num_workers=args.workers,
        multiprocessing_context=args.start_method if args.workers else None,
        generator=torch.Generator().manual_seed(3),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for epoch in range(args.epochs):
        total = 0.0
        for batch in loader:
            keep = torch.arange(batch.labels.numel())[: batch.labels.numel()]
            loss = F.cross_entropy(model(batch.images[keep]), batch.labels[keep])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item()
        print(f"epoch {epoch}: loss {total / len(loader):.6f}")
    checksum = sum(p.double().sum().item() for p in model.state_dict().values())
    print(f"checksum {checksum:.10f}")


if __name__ == "__main__":
    main()
