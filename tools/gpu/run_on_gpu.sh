#!/usr/bin/env bash
# One call on a GPU machine (no TensorFlow needed): build the CUDA table's harness, run the device correctness
# checks, then the throughput benchmark. Logs and the benchmark's JSON go to $1 (default: build/gpu-run).
#
#   bash tools/gpu/run_on_gpu.sh [OUT_DIR] [BENCH_ARGS...]
#
# Each step has its own time limit, so a hang in one still leaves the others' logs.
set -u
out=${1:-build/gpu-run}
shift || true
mkdir -p "$out"
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv || true
  command -v nvcc && nvcc --version | tail -1
  nproc
} 2>&1 | tee "$out/machine.txt"
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
if ! timeout 300 make --no-print-directory cuda NVCC="$NVCC" >"$out/build.log" 2>&1; then
  echo "== build failed"
  tail -30 "$out/build.log"
  exit 1
fi
lib=build/cuda/libtfext_gpu_table.so
echo "== correctness (tools/gpu/test_gpu_table.py)"
timeout "${TEST_TIMEOUT:-240}" python3 tools/gpu/test_gpu_table.py --lib "$lib" 2>&1 | tee "$out/test.log"
echo "== test exit: ${PIPESTATUS[0]}"
echo "== benchmark (tools/gpu/bench_gpu_table.py $*)"
timeout "${BENCH_TIMEOUT:-300}" python3 tools/gpu/bench_gpu_table.py --lib "$lib" --json "$out/bench_gpu_table.json" "$@" \
  2>&1 | tee "$out/bench.log"
echo "== bench exit: ${PIPESTATUS[0]}"
