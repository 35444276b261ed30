#!/usr/bin/env bash
# `make gpu-check`: everything that needs a GPU, as one prepared script (< 8 minutes: 240 + 90 + 100 s bounds).
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
  $PY -m safetorch doctor
} > "$OUTDIR/doctor.txt" 2>&1
timeout 240 $PY -m pytest -q -p no:cacheprovider tests/gpu -rA > "$OUTDIR/tests_gpu.txt" 2>&1
echo "tests/gpu exit: $?" | tee -a "$OUTDIR/tests_gpu.txt"
# CUDA benchmarks: checked indexing raise/deferred/clip at 1M indices (with sync counts);
# PointwiseConv1d, DataLoader and cuda_timer vs torch.utils.benchmark on the GPU.
timeout 90 $PY benchmarks/bench_tensor.py --cuda-only > "$OUTDIR/bench_tensor.md" 2>&1
echo "bench_tensor exit: $?"
timeout 100 $PY benchmarks/bench_data_timing.py --quick --threads 0 > "$OUTDIR/bench_data_timing.md" 2>&1
echo "bench_data_timing exit: $?"
tail -n 5 "$OUTDIR"/tests_gpu.txt
ls -la "$OUTDIR"
