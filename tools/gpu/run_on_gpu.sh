#!/usr/bin/env bash
# One call on a GPU machine (no TensorFlow needed): build the CUDA table's harness, run the device correctness
# checks (float32, bfloat16 and float16 rows), then the throughput benchmark (find / insert / accumulate /
# find-or-insert / fused Adam keys/s per row storage). Logs and the benchmark's JSON go to $1 (default:
# build/gpu-run).
#
#   bash tools/gpu/run_on_gpu.sh [OUT_DIR] [BENCH_ARGS...]
#
# Builds for sm_90 only by default (an H100 / H200; CUDA_ARCHS="80 90" builds both, as `make cuda`). Without
# BENCH_ARGS the benchmark runs dims 16 and 64 at load 0.5 for every storage. Each step has its own time limit
# (BUILD_TIMEOUT, TEST_TIMEOUT, BENCH_TIMEOUT seconds; 120 + 70 + 50 by default, so the whole call stays under four
# minutes), and a hang in one still leaves the others' logs.
set -u
out=${1:-build/gpu-run}
shift || true
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv || true
  command -v nvcc && nvcc --version | tail -1
  nproc
} 2>&1 | tee "$out/machine.txt"
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
echo "== build (make cuda CUDA_ARCHS=\"${CUDA_ARCHS:-90}\")"
if ! timeout "${BUILD_TIMEOUT:-120}" make --no-print-directory -j2 cuda NVCC="$NVCC" CUDA_ARCHS="${CUDA_ARCHS:-90}" \
  >"$out/build.log" 2>&1; then
  echo "== build failed"
  tail -30 "$out/build.log"
  exit 1
fi
lib=build/cuda/libtfext_gpu_table.so
echo "== correctness (tools/gpu/test_gpu_table.py)"
timeout "${TEST_TIMEOUT:-70}" python3 tools/gpu/test_gpu_table.py --lib "$lib" 2>&1 | tee "$out/test.log"
echo "== test exit: ${PIPESTATUS[0]}"
if [ $# -eq 0 ]; then
  set -- --dims 16,64 --loads 0.5 --storages float32,bfloat16,float16 --repeats 5 --cpu-repeats 2
fi
echo "== benchmark (tools/gpu/bench_gpu_table.py $*)"
timeout "${BENCH_TIMEOUT:-50}" python3 tools/gpu/bench_gpu_table.py --lib "$lib" --json "$out/bench_gpu_table.json" "$@" \
  2>&1 | tee "$out/bench.log"
echo "== bench exit: ${PIPESTATUS[0]}"
