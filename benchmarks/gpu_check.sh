#!/usr/bin/env bash
# `make gpu-check`: everything that needs a GPU, as one prepared script (< 8 minutes).
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
timeout 300 $PY -m pytest -q -p no:cacheprovider tests/gpu -rA > "$OUTDIR/tests_gpu.txt" 2>&1
echo "tests/gpu exit: $?" | tee -a "$OUTDIR/tests_gpu.txt"
for b in bench_tensor:--cuda-only bench_data_timing:--cuda bench_checkpoint:--cuda; do
  script=${b%%:*}; flag=${b#*:}
  if [ -f "benchmarks/$script.py" ]; then
    timeout 120 $PY "benchmarks/$script.py" $flag > "$OUTDIR/$script.md" 2>&1
    echo "$script exit: $?"
  fi
done
tail -n 5 "$OUTDIR"/tests_gpu.txt
ls -la "$OUTDIR"
