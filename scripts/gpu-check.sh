#!/usr/bin/env bash
# One full check on a GPU host (the lent H200): builds everything with all cores in build/gpu, runs
# the whole ctest suite (GPU tests included), and writes logs under the folder given (default
# gpu-results/). The device image already has every build dependency (see docs/gpu-host.md).
#   scripts/gpu-check.sh "$OUT"
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu-results}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  nvcc --version | tail -1
  git rev-parse --short HEAD 2>/dev/null || true
} > "$out/gpu.txt" 2>&1
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > "$out/configure.log" 2>&1 || { tail -20 "$out/configure.log"; exit 1; }
cmake --build build/gpu -j "$(nproc)" > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
ctest --test-dir build/gpu -j 8 --output-on-failure > "$out/ctest.log" 2>&1
rc=$?
grep -E "CudaDevice|tests passed|tests failed|Skipped|Failed" "$out/ctest.log" | tail -12
cat "$out/gpu.txt"
exit $rc
