"""Demo: a PinnedBatch DataLoader, the loader checks, and a cuda_timer measurement."""

from __future__ import annotations

import dataclasses
import time
import warnings

import torch
from torch.utils.data import DataLoader, TensorDataset

import safetorch as st


@dataclasses.dataclass
class Batch(st.PinnedBatch):
    image: torch.Tensor
    label: torch.Tensor


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"accelerator available: {st.accelerator_available()} (device for this demo: {device})")

    # 1. A dataclass batch through DataLoader(pin_memory=True): pinned field by field on a
    #    GPU machine, a silent no-op on CPU (plain Tensor.pin_memory() raises there).
    ds = TensorDataset(torch.randn(10, 3, 8, 8), torch.arange(10))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*no accelerator.*")  # torch's own notice
        loader = DataLoader(ds, batch_size=4, pin_memory=True, collate_fn=st.collate(Batch))
        for batch in loader:
            moved = batch.to(device)  # non_blocking exactly when the source is pinned
            print(
                f"  {type(batch).__name__}: image {tuple(batch.image.shape)}, "
                f"pinned={batch.image.is_pinned()}, moved to {moved.image.device}"
            )

    # 2. The seed's partial last batch: 19,130 samples with batch_size=4.
    seed = DataLoader(TensorDataset(torch.zeros(19130, 1)), batch_size=4)
    print("check_loader on 19,130 samples, batch_size=4:")
    for finding in st.check_loader(seed):
        print(f"  {finding}")

    # 3. Timing: wall clock without synchronize measures only the launches on a GPU.
    a = torch.randn(512, 512, device=device)
    t0 = time.perf_counter()
    a @ a
    naive_ms = (time.perf_counter() - t0) * 1e3
    with st.cuda_timer() as t:
        a @ a
    print(
        f"matmul 512x512 on {device}: naive perf_counter {naive_ms:.3f} ms, "
        f"st.cuda_timer {t.ms:.3f} ms"
    )
    print(f"st.benchmark: {st.benchmark(torch.mm, a, a, warmup=2, repeat=10)}")

    # 4. PointwiseConv1d: nn.Conv1d(k=1) parameters, conv or linear whichever is faster.
    conv = torch.nn.Conv1d(256, 128, kernel_size=1).to(device)
    pw = st.PointwiseConv1d(256, 128).to(device)
    pw.load_state_dict(conv.state_dict())
    x = torch.randn(16, 256, 64, device=device)
    with torch.no_grad():
        same = torch.allclose(pw(x), conv(x), atol=1e-5)
    choice = list(st.PointwiseConv1d.autotune_cache().values())
    print(f"PointwiseConv1d matches nn.Conv1d: {same}; autotuned choice: {choice}")


if __name__ == "__main__":
    main()
