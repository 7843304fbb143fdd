#!/usr/bin/env bash
# The distributed runtime on a GPU host, in one call of a few minutes: builds build/gpu (with the
# Python module), runs the device tests (DistDevice.*, DeviceComm.*, the killed-rank jobs, the
# kernels' fp32-output tests, Cli.RunOnGpus*), the Python DistAttention on CUDA tensors,
# compute-sanitizer memcheck on a two-process staged DistAttention, and `flexcp run --device
# cuda` on 3 staged ranks (stage timings), and with DIST_BENCH="lengths" the world-size-1
# benchmark (`flexcp bench --dist`: DistAttention on one rank over NCCL against the bare kernel,
# GQA 64:8, hd128, bf16, on causal, varlen causal, window 1024 in documents and prefix-LM masks).
# DIST_TESTS replaces the ctest regex; SKIP_TESTS=1 builds and benchmarks only (the whole run with
# DIST_BENCH="32768 131072" passes the 600 s of one device call). Logs under OUT (default
# gpu-results/).
#   scripts/gpu-dist.sh OUT
# Carry .deps/cutlass (docs/gpu-host.md).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu-results}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
summary="$out/summary.txt"
date -u > "$summary"
# shellcheck source=scripts/gpu-build.sh
source scripts/gpu-build.sh  # build/gpu; sets `serialised`

rc=0
if [[ -z "${SKIP_TESTS:-}" ]]; then
  t0=$SECONDS
  ctest --test-dir build/gpu -j 4 --output-on-failure \
    -R "${DIST_TESTS:-DistDevice|DeviceComm|Fp32Output|Fp32KeyGradients|RunOnGpus|Errors}" \
    > "$out/ctest.log" 2>&1
  rc=$?
  echo "ctest: rc $rc, $((SECONDS - t0)) s; $(grep -E 'tests passed|tests failed' "$out/ctest.log")" \
    >> "$summary"

  t0=$SECONDS
  pkg=$(mktemp -d)
  cp -r python/flexcp "$pkg/" && cp build/gpu/python/_flexcp*.so "$pkg/flexcp/"
  PYTHONPATH=$pkg python3 -m pytest -q -rs tests/python/test_dist.py > "$out/pytest.log" 2>&1
  prc=$?
  ((prc == 0)) || rc=1
  echo "pytest test_dist.py: rc $prc, $((SECONDS - t0)) s; $(tail -1 "$out/pytest.log")" >> "$summary"

  # memcheck on every rank of a two-process staged job (DESIGN §6: sanitizers on a small case).
  t0=$SECONDS
  mpirun --allow-run-as-root --oversubscribe -np 2 -x NCCL_NVLS_ENABLE=0 -x OMP_NUM_THREADS=1 \
    compute-sanitizer --tool memcheck --error-exitcode 3 build/gpu/tests/dist_device_tests \
    --backend staged > "$out/memcheck-dist.log" 2>&1
  src=$?
  ((src == 0)) || rc=1
  echo "memcheck, 2 staged ranks: rc $src, $((SECONDS - t0)) s; $(grep -cE 'ERROR SUMMARY: 0 errors' \
    "$out/memcheck-dist.log") of 2 ranks with 0 errors" >> "$summary"

  # The fp32 output's epilogue branch under racecheck.
  compute-sanitizer --tool racecheck --error-exitcode 3 build/gpu/tests/cuda_tests \
    --gtest_filter='Sm90Forward.Fp32Output*' > "$out/racecheck-fwd.log" 2>&1
  src=$?
  ((src == 0)) || rc=1
  echo "racecheck Sm90Forward.Fp32Output*: rc $src; $(grep -E 'RACECHECK SUMMARY' \
    "$out/racecheck-fwd.log" | head -1)" >> "$summary"

  # The main job's device form on 3 ranks sharing the GPU: per-rank bytes, stage waits and kernels.
  mpirun --allow-run-as-root --oversubscribe -np 3 -x NCCL_NVLS_ENABLE=0 \
    build/gpu/tools/flexcp/flexcp run --device cuda --comm staged --seqlen 32768 --layers 2 \
    > "$out/run-staged.log" 2>&1
  echo "flexcp run --device cuda --comm staged -np 3: rc $?" >> "$summary"
fi

for t in ${DIST_BENCH:-}; do
  for m in "causal" "varlen-causal" "sliding-window --window 1024" "prefix-lm"; do
    # shellcheck disable=SC2086  # $m is the mask and its options
    build/gpu/tools/flexcp/flexcp bench --device cuda --dist --backward --mask $m --seqlen "$t" \
      --heads 64 --heads-kv 8 --head-dim 128 --dtype bf16 --repeat 5 2>&1 | grep -E "\[result\]"
  done
done > "$out/dist-bench.log"
# One line per case and direction: the kernel's and the distributed path's TFLOPS, and their ratio.
grep "path=dist" "$out/dist-bench.log" | sed -E 's/.*mask=(.*) Tq=.* dir=([^ ]+) .*TFLOPS=([0-9.]+) kernel_over_dist=([0-9.]+).*/\1 \2: dist \3 TFLOPS, kernel\/dist \4/' \
  >> "$summary"
((rc == 0)) || grep -hE "Failed|FAILED|ERROR" "$out"/*.log | head -20
cat "$summary"
((serialised == 0)) || rc=1
exit $rc
