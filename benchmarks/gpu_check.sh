#!/usr/bin/env bash
# `make gpu-check`: everything that needs a GPU, as one prepared script (< 8 minutes: the
# 15 + 220 + 135 + 100 s bounds below add up to 470 s).
# Runs with the machine's own python3 (PYTHONPATH=. — no venv on the GPU machine).
# Copies results into $OUT when that variable is set.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH=.
OUTDIR=${OUT:-benchmarks/gpu-results}
mkdir -p "$OUTDIR"
{
  echo "# gpu-check $(date -u +%Y-%m-%dT%H:%MZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | head -3
  timeout 15 $PY -m safetorch doctor
} > "$OUTDIR/doctor.txt" 2>&1
timeout 220 $PY -m pytest -q -p no:cacheprovider tests/gpu -rA > "$OUTDIR/tests_gpu.txt" 2>&1
echo "tests/gpu exit: $?" | tee -a "$OUTDIR/tests_gpu.txt"
# Checked indexing on CUDA: raw vs the fused Triton kernel vs the torch-op path at 1K/1M/100M
# indices (fp32, bf16) in every mode, host syncs counted, training steps plain vs patched
# (supersedes bench_tensor.py --cuda-only, whose 1M rows it contains).
timeout 135 $PY benchmarks/bench_fused_index.py --budget 115 > "$OUTDIR/bench_fused_index.md" 2>&1
echo "bench_fused_index exit: $?"
# PointwiseConv1d, DataLoader and cuda_timer vs torch.utils.benchmark on the GPU.
timeout 100 $PY benchmarks/bench_data_timing.py --quick --threads 0 > "$OUTDIR/bench_data_timing.md" 2>&1
echo "bench_data_timing exit: $?"
tail -n 5 "$OUTDIR"/tests_gpu.txt
ls -la "$OUTDIR"
