"""Demo: a DataParallel checkpoint loads into a plain model, with a report; unsafe files refused."""

import os
import tempfile

import torch

import safetorch as st


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8))
        self.head = torch.nn.Linear(8, 10)


directory = tempfile.mkdtemp()
path = os.path.join(directory, "dp.pt")

# 1. Saved from DataParallel: every key starts with "module."
torch.save({"state_dict": torch.nn.DataParallel(Net()).state_dict(), "epoch": 7}, path)
try:
    Net().load_state_dict(torch.load(path)["state_dict"])
except RuntimeError as exc:
    print("torch:", str(exc).splitlines()[0], "...")

report = st.load_state_dict(Net(), path)
print("\nsafetorch:")
print(report)

# 2. A shape mismatch with strict=False: torch raises, safetorch skips and reports.
other = torch.nn.DataParallel(Net())
other.module.head = torch.nn.Linear(8, 5)
report = st.load_state_dict(Net(), other.state_dict(), strict=False)
print("\nstrict=False with a different head:", report.summary(), report.mismatched)


# 3. A checkpoint that would run a command is refused, naming every unsafe global.
class Evil:
    def __reduce__(self):
        return os.system, ("echo pwned",)


torch.save({"state_dict": Net().state_dict(), "x": Evil()}, path)
try:
    st.load(path)
except st.UnsafeCheckpointError as exc:
    print("\nrefused:", exc.unsafe_globals)

# 4. Best/last saving, atomic, resumable.
saver = st.CheckpointSaver(os.path.join(directory, "run"), mode="max")
for epoch, acc in enumerate([0.61, 0.70, 0.66]):
    saver.save({"model": Net().state_dict(), "epoch": epoch}, epoch=epoch, metric=acc)
print(f"\nbest epoch {saver.best_epoch} (acc {saver.best_metric}), last epoch {saver.last_epoch}")
