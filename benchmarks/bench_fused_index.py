"""Benchmark (CUDA): checked indexing, fused Triton kernel vs the raw op vs the torch-op path.

Issue 26's goals, measured in one prepared run (``make gpu-check``; stdout only, a markdown
report for benchmarks/RESULTS.md):

* raw torch op vs ``fused`` (one Triton kernel: safetorch._triton_index) vs ``torch path``
  (today's torch ops, Triton reported absent) for ``x[idx]``, ``index_select`` and ``gather``
  in every mode at 1K, 1M and 100M indices, float32 and bfloat16. Goals: fused <= 1.1x raw at
  >= 1M indices in every mode but raise; raise <= raw + one sync.
* host syncs per call for each mode and path (``torch.cuda.set_sync_debug_mode("warn")``
  counts them): fused 0 in clip/wrap/fill/deferred, 1 in raise.
* two training steps (an embedding lookup + a transformer block; a detection-style top-k gather)
  plain vs under monkeypatch mode (``st.patched()``, what ``safetorch run`` turns on), fused
  and torch path. Goal: <= 1.05x plain.

Each time is the median over rounds of a loop of calls between two CUDA events (``µs/call``:
what a training loop sees); ``enqueue µs`` is the host time to issue one call, which bounds the
rate when it exceeds the GPU time. Rows run in order of importance (1M, the training steps,
100M, 1K) under a time budget (``--budget``, seconds); rows past it print as not measured.
PointwiseConv1d's CUDA table is in the same ``make gpu-check`` run (bench_data_timing.py).

Run: ``python benchmarks/bench_fused_index.py [--budget 120] [--quick]``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import platform
import statistics
import time
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch

import safetorch as st
from safetorch import _compat

MODES = ["raise", "clip", "wrap", "fill", "deferred"]
_DEADLINE = [float("inf")]


def _over_budget() -> bool:
    return time.monotonic() > _DEADLINE[0]


@contextlib.contextmanager
def torch_path() -> Iterator[None]:
    """safetorch's torch-op path: Triton reported absent (the fused kernel is never called)."""
    with _compat.override(HAS_TRITON=False):
        yield


def time_calls(
    fn: Callable[[], Any], *, rounds: int, target_s: float = 0.004
) -> Tuple[float, float]:
    """(median µs per call on the GPU timeline, µs of host time to enqueue one call)."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    one = max(time.perf_counter() - t0, 1e-6)
    number = max(3, min(200, int(target_s / one)))
    per_call: List[float] = []
    enqueue: List[float] = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(rounds):
        torch.cuda.synchronize()
        h0 = time.perf_counter()
        start.record()
        for _ in range(number):
            fn()
        end.record()
        enqueue.append((time.perf_counter() - h0) / number)
        end.synchronize()
        per_call.append(start.elapsed_time(end) * 1e3 / number)
    return statistics.median(per_call), statistics.median(enqueue) * 1e6


def count_syncs(fn: Callable[[], Any]) -> int:
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message).lower() for w in caught)


def _ops(
    x: torch.Tensor, idx: torch.Tensor
) -> Dict[str, Tuple[Callable[[], Any], Callable[[str], Any]]]:
    return {
        "x[idx]": (lambda: x[idx], lambda m: st.checked_index(x, idx, mode=m, fill_value=0)),
        "index_select": (
            lambda: torch.index_select(x, 0, idx),
            lambda m: st.index_select(x, 0, idx, mode=m, fill_value=0),
        ),
        "gather": (
            lambda: torch.gather(x, 0, idx),
            lambda m: st.gather(x, 0, idx, mode=m, fill_value=0),
        ),
    }


HEADER = (
    "| op | dtype | indices | mode | raw µs | fused µs | fused/raw | torch path µs | "
    "torch path/raw | fused enqueue µs | syncs fused / torch path | goal |\n"
    "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|---|"
)


def _goal(mode: str, n: int, raw: float, fused: Optional[float], syncs: Optional[int]) -> str:
    if fused is None:
        return "fused n/a"
    if mode == "raise":
        ok = syncs == 1  # the one sync by design; its cost is the read-back, timed in the row
        return f"1 sync: {'met' if ok else 'missed'}"
    if n < 1_000_000:
        return "-"
    return f"≤ 1.1×: {'met' if fused <= 1.1 * raw else 'missed'}"


def index_table(n: int, dtypes: List[torch.dtype], rounds: int) -> None:
    print(f"\n### {n:,} indices (x has {n:,} elements; valid random indices)\n\n{HEADER}")
    for dtype in dtypes:
        x = torch.randn(n, device="cuda").to(dtype)
        idx = torch.randint(0, n, (n,), device="cuda")
        for name, (raw, ours) in _ops(x, idx).items():
            raw_t = None
            for mode in MODES:
                if _over_budget():
                    print(f"| {name} | {str(dtype)[6:]} | {n:,} | {mode} | not measured: budget |")
                    continue
                st.clear_deferred()
                if raw_t is None:
                    raw_t = time_calls(raw, rounds=rounds)[0]
                fused_t: Optional[float] = None
                enq = "-"
                syncs_fused: Optional[int] = None
                if _compat.HAS_TRITON:
                    fused_t, enq_us = time_calls(lambda m=mode: ours(m), rounds=rounds)
                    enq = f"{enq_us:.1f}"
                    syncs_fused = count_syncs(lambda m=mode: ours(m))
                with torch_path():
                    torch_t = time_calls(lambda m=mode: ours(m), rounds=rounds)[0]
                    syncs_torch = count_syncs(lambda m=mode: ours(m))
                st.raise_deferred()  # valid indices: nothing recorded
                fused_cells = (
                    f"{fused_t:.1f} | {fused_t / raw_t:.2f}" if fused_t is not None else "n/a | -"
                )
                print(
                    f"| {name} | {str(dtype)[6:]} | {n:,} | {mode} | {raw_t:.1f} | {fused_cells} | "
                    f"{torch_t:.1f} | {torch_t / raw_t:.2f} | {enq} | "
                    f"{syncs_fused if syncs_fused is not None else '-'} / {syncs_torch} | "
                    f"{_goal(mode, n, raw_t, fused_t, syncs_fused)} |"
                )
        del x, idx
        torch.cuda.empty_cache()


# --- training steps --------------------------------------------------------------------------
def _lm_step() -> Callable[[], None]:
    """An embedding lookup (``weight[tokens]``: the x[idx] form), one transformer block and a
    tied output projection, backward and AdamW, in bf16 autocast."""
    torch.manual_seed(0)
    vocab, d, batch, seq = 8192, 512, 16, 256
    emb = torch.nn.Parameter(torch.randn(vocab, d, device="cuda") * 0.02)
    block = torch.nn.TransformerEncoderLayer(d, 8, 4 * d, batch_first=True, device="cuda")
    opt = torch.optim.AdamW([emb, *block.parameters()], lr=1e-4)
    tokens = torch.randint(0, vocab, (batch, seq), device="cuda")
    targets = torch.randint(0, vocab, (batch, seq), device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            h = block(emb[tokens])
            logits = h @ emb.t()
            loss = torch.nn.functional.cross_entropy(
                logits.float().flatten(0, 1), targets.flatten()
            )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def _detection_step() -> Callable[[], None]:
    """Per-anchor features, top-k scores, then ``gather`` / ``index_select`` of the chosen
    anchors' features and boxes (a detection head's form), backward and SGD."""
    torch.manual_seed(0)
    batch, anchors, c, k = 8, 20_000, 256, 1000
    feats_in = torch.randn(batch, anchors, c, device="cuda")
    boxes = torch.randn(batch, anchors, 4, device="cuda")
    trunk = torch.nn.Linear(c, c, device="cuda")
    score = torch.nn.Linear(c, 1, device="cuda")
    head = torch.nn.Linear(c, 4, device="cuda")
    opt = torch.optim.SGD([*trunk.parameters(), *score.parameters(), *head.parameters()], lr=1e-3)

    def step() -> None:
        feats = torch.relu(trunk(feats_in))
        s = score(feats).squeeze(-1)
        top = s.topk(k, dim=1).indices  # [batch, k]
        chosen = feats.gather(1, top.unsqueeze(-1).expand(-1, -1, c))
        picked = boxes.gather(1, top.unsqueeze(-1).expand(-1, -1, 4))
        flat = feats.reshape(-1, c).index_select(
            0, (top + torch.arange(batch, device="cuda")[:, None] * anchors).reshape(-1)
        )
        loss = ((head(chosen) - picked) ** 2).mean() + flat.mean() + s.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def training_table(rounds: int) -> None:
    print(
        "\n### Training steps: plain vs monkeypatch mode (`st.patched()`, as under "
        "`safetorch run`)\n\n| step | plain ms | patched, fused ms | fused/plain | "
        "patched, torch path ms | torch path/plain | goal ≤ 1.05× |\n"
        "|---|---:|---:|---:|---:|---:|---|"
    )
    for name, make in (
        ("embedding + transformer block", _lm_step),
        ("detection gather", _detection_step),
    ):
        if _over_budget():
            print(f"| {name} | not measured: budget |")
            continue
        step = make()
        plain = time_calls(step, rounds=rounds, target_s=0.05)[0] / 1e3
        fused: Optional[float] = None
        with st.patched():
            if _compat.HAS_TRITON:
                fused = time_calls(step, rounds=rounds, target_s=0.05)[0] / 1e3
            with torch_path():
                torch_t = time_calls(step, rounds=rounds, target_s=0.05)[0] / 1e3
        cells = f"{fused:.3f} | {fused / plain:.3f}" if fused is not None else "n/a | -"
        verdict = "fused n/a" if fused is None else ("met" if fused <= 1.05 * plain else "missed")
        print(
            f"| {name} | {plain:.3f} | {cells} | {torch_t:.3f} | {torch_t / plain:.3f} | {verdict} |"
        )
        del step
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=120.0, help="seconds for all rows")
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    args = parser.parse_args()
    print(
        f"# bench_fused_index — {datetime.date.today()} — torch {torch.__version__}, "
        f"Python {platform.python_version()}, {platform.machine()}"
    )
    if not torch.cuda.is_available():
        print("\nno CUDA device: skipped (run `make gpu-check` on a GPU machine)")
        return
    triton_version = "absent: fused n/a"
    if _compat.HAS_TRITON:
        import triton

        triton_version = triton.__version__
    print(f"\n{torch.cuda.get_device_name(0)}; triton {triton_version}")
    _DEADLINE[0] = time.monotonic() + args.budget
    rounds = 3 if args.quick else 5
    dtypes = [torch.float32, torch.bfloat16]
    index_table(1_000_000, dtypes, rounds)
    training_table(rounds)
    index_table(100_000_000, dtypes, 3)
    index_table(1_000, dtypes, rounds)


if __name__ == "__main__":
    main()
