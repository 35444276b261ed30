"""Loading a ~1 GB DataParallel checkpoint into a plain model, side by side in one run.

Three layouts of the same weights (keys with DataParallel's ``module.``):
* one torch.save file: torch.load + strip + load_state_dict (a), the same with mmap=True (b),
  st.load_state_dict (c);
* a DCP directory: torch's dcp_to_torch_save + torch.load + strip + load_state_dict (d),
  st.load_state_dict (e);
* safetensors shards with an index: safetensors.torch.load_file per shard + strip +
  load_state_dict(strict=False) (f), st.load_state_dict (g).

Each variant runs in its own process (fresh peak RSS from resource.getrusage), the variants
alternated over the repeats; the files are read once beforehand so every variant starts from
a warm page cache. The clock starts after ``import torch`` and the model's construction, before
``import safetorch`` (a cold load: the import of what the load needs is included). Prints a
markdown table with the median time and peak RSS, and the ratios the issues target.

``--views`` instead measures the ways of reading file bytes into a tensor without a copy
(numpy's buffer vs ctypes over the tensor's memory vs bytearray + torch.frombuffer + copy_),
the choice behind ``safetorch/checkpoint/_bytes.py``.

Usage: python benchmarks/bench_checkpoint.py [--gb 1.0] [--repeats 3] [--only abc] [--views]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

VARIANTS = {
    "a": "file: torch.load + dict comprehension + load_state_dict",
    "b": "file: torch.load(mmap=True) + dict comprehension + load_state_dict",
    "c": "file: st.load_state_dict(model, path)",
    "d": "DCP: dcp_to_torch_save + torch.load + strip + load_state_dict",
    "e": "DCP: st.load_state_dict(model, dcp_dir)",
    "f": "shards: safetensors load_file per shard + strip + load_state_dict",
    "g": "shards: st.load_state_dict(model, shard_dir)",
}
LAYOUT_OF = {
    "a": "file",
    "b": "file",
    "c": "file",
    "d": "dcp",
    "e": "dcp",
    "f": "shards",
    "g": "shards",
}


def _strip(sd):
    return {k[len("module.") :] if k.startswith("module.") else k: v for k, v in sd.items()}


def build_model(gb: float):
    import torch

    width = 4096
    layers = max(1, round(gb * 2**30 / (width * width * 4)))
    with torch.device("meta"):
        model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    return model.to_empty(device="cpu")


def child(variant: str, path: str, gb: float) -> None:
    import torch

    model = build_model(gb)
    start = time.perf_counter()  # a cold load: safetorch's import is part of it
    if variant in ("c", "e", "g"):
        import safetorch as st

        report = st.load_state_dict(model, path)
        assert report.ok, report
    elif variant == "d":
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        tmp = os.path.join(tempfile.mkdtemp(prefix="bench_dcp_"), "full.pt")
        dcp_to_torch_save(path, tmp)
        sd = torch.load(tmp, map_location="cpu", weights_only=True)
        model.load_state_dict(_strip(sd))
        os.unlink(tmp)
    elif variant == "f":
        import json as _json

        from safetensors.torch import load_file

        with open(os.path.join(path, "model.safetensors.index.json")) as fh:
            shards = sorted(set(_json.load(fh)["weight_map"].values()))
        for shard in shards:
            model.load_state_dict(_strip(load_file(os.path.join(path, shard))), strict=False)
    else:
        kwargs = {"mmap": True} if variant == "b" else {}
        sd = torch.load(path, map_location="cpu", weights_only=True, **kwargs)
        model.load_state_dict(_strip(sd))
    seconds = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"seconds": seconds, "peak_rss_mb": peak_kib / 1024}))


def bench_views(repeats: int, nbytes: int = 64 << 20) -> None:
    """Read a file into a (pre-faulted) tensor through each kind of byte view, alternated."""
    import ctypes

    import torch

    def numpy_view(t):
        return memoryview(t.numpy()).cast("B")

    def ctypes_view(t):
        return memoryview((ctypes.c_ubyte * t.numel()).from_address(t.data_ptr())).cast("B")

    fd, path = tempfile.mkstemp(prefix="bench_views_")
    os.write(fd, os.urandom(nbytes))
    target = torch.ones(nbytes, dtype=torch.uint8)
    spare = bytearray(nbytes)

    def read(view) -> None:
        got = 0
        while got < nbytes:
            got += os.preadv(fd, [view[got:]], got)

    def frombuffer_copy(t) -> None:
        read(memoryview(spare))
        t.copy_(torch.frombuffer(spare, dtype=torch.uint8))

    ways = {
        "memoryview(t.numpy()) (needs numpy)": lambda: read(numpy_view(target)),
        "ctypes view of the tensor's memory": lambda: read(ctypes_view(target)),
        "bytearray + torch.frombuffer + copy_": lambda: frombuffer_copy(target),
    }
    times = {name: [] for name in ways}
    for _ in range(max(repeats, 5)):
        for name, way in ways.items():
            start = time.perf_counter()
            way()
            times[name].append(time.perf_counter() - start)
    os.close(fd)
    os.unlink(path)
    print(f"reading {nbytes >> 20} MiB into a tensor, median of {max(repeats, 5)}\n")
    print("| byte view | ms |")
    print("|---|---|")
    for name, ts in times.items():
        print(f"| {name} | {statistics.median(ts) * 1e3:.1f} |")


def _warm(path: str) -> None:
    files = [path] if os.path.isfile(path) else [os.path.join(path, n) for n in os.listdir(path)]
    for f in files:
        with open(f, "rb") as fh:  # warm the page cache for every variant alike
            while fh.read(64 << 20):
                pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="".join(VARIANTS), help="variants to run, e.g. abc")
    parser.add_argument("--child", nargs=2, metavar=("VARIANT", "PATH"))
    parser.add_argument("--views", action="store_true", help="byte views into a tensor")
    args = parser.parse_args()
    if args.views:
        bench_views(args.repeats)
        return
    if args.child:
        child(args.child[0], args.child[1], args.gb)
        return
    import shutil
    import warnings

    import torch

    directory = tempfile.mkdtemp(prefix="bench_ckpt_")
    paths = {
        "file": os.path.join(directory, "dp.pt"),
        "dcp": os.path.join(directory, "dcp"),
        "shards": os.path.join(directory, "shards"),
    }
    model = build_model(args.gb)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    dp_state = torch.nn.DataParallel(model).state_dict()
    variants = [v for v in VARIANTS if v in args.only]
    layouts_needed = {LAYOUT_OF[v] for v in variants}
    torch.save(dp_state, paths["file"])
    if "dcp" in layouts_needed:
        import torch.distributed.checkpoint as dcp

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save(dp_state, checkpoint_id=paths["dcp"])
    if "shards" in layouts_needed:
        from safetorch.checkpoint import _conversions

        _conversions.save_sharded_safetensors(dp_state, paths["shards"], 256 * 2**20)
    size_gb = os.path.getsize(paths["file"]) / 2**30
    del model, dp_state
    for layout in layouts_needed:
        _warm(paths[layout])
    results = {v: [] for v in variants}
    # Imports read bytecode, as from an installed package (written once, by a warm-up child,
    # to a temporary PYTHONPYCACHEPREFIX), never compiled from source inside the timing.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = os.path.join(directory, "pycache")
    for _ in range(args.repeats + 1):
        for v in variants:  # interleaved, so drift hits every variant
            out = subprocess.run(
                [sys.executable, __file__, "--gb", str(args.gb), "--child", v, paths[LAYOUT_OF[v]]],
                capture_output=True,
                text=True,
                check=True,
                env=env,
            )
            results[v].append(json.loads(out.stdout.strip().splitlines()[-1]))
    results = {v: rs[1:] for v, rs in results.items()}  # the first round wrote the bytecode
    shutil.rmtree(directory)
    best = {v: statistics.median(r["seconds"] for r in rs) for v, rs in results.items()}
    rss = {v: statistics.median(r["peak_rss_mb"] for r in rs) for v, rs in results.items()}
    print(
        f"checkpoint: {size_gb:.2f} GB, median of {args.repeats} fresh processes (import of "
        f"safetorch included), torch {torch.__version__}\n"
    )
    print("| variant | time (s) | peak RSS (MB) |")
    print("|---|---|---|")
    for v in variants:
        print(f"| ({v}) {VARIANTS[v]} | {best[v]:.3f} | {rss[v]:.0f} |")
    print()
    for ours, peers, target in (
        ("c", ("a",), "(c) vs (a): target >= 3x faster"),
        ("c", ("b",), "(c) vs (b): target <= 1.0x time, <= 0.6x peak RSS"),
        ("e", ("d",), "(e) vs (d): target <= 1.1x time and RSS"),
        ("g", ("f",), "(g) vs (f): target <= 1.1x time and RSS"),
    ):
        if ours in best and all(p in best for p in peers):
            p = peers[0]
            print(
                f"- {target}: ({ours}) takes {best[ours] / best[p]:.2f}x the time of ({p}) "
                f"({best[p] / best[ours]:.2f}x faster), peak RSS {rss[ours] / rss[p]:.2f}x"
            )


if __name__ == "__main__":
    main()
