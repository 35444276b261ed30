"""train_legacy.py fixed by hand: what monkeypatch mode does for it, written out.

Each fix is one line: F.interpolate(align_corners=True) for upsample_bilinear, the
``module.`` prefix stripped before load_state_dict, weights_only/map_location given to
torch.load, pin_memory only with CUDA, and no SyncBatchNorm conversion without a process group.
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
        x = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True)
        x = self.conv2(x)
        return self.head(x.mean(dim=(2, 3)))


@dataclass
class Batch:
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
    model = nn.DataParallel(Net())
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
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict({k.removeprefix("module."): v for k, v in state.items()})
    # no SyncBatchNorm: this program never starts a process group

    loader = DataLoader(
        Shapes(),
        batch_size=8,
        shuffle=True,
        collate_fn=collate,
        pin_memory=torch.cuda.is_available(),
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
