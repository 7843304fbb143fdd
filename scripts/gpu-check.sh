#!/usr/bin/env bash
# One full check on a GPU host (the lent H200): builds everything with all cores in build/gpu, reads
# the kernel's resources and instructions, runs the whole ctest suite (GPU tests included), runs
# compute-sanitizer memcheck and racecheck on a small case, times the forward's softmax beside the
# kernel's other work (bench/sm90_softmax_contention), and, when lengths are given, the
# benchmark against the peers. Writes its logs under the folder given (default gpu-results/).
#   scripts/gpu-check.sh OUT [bench lengths...]       e.g. scripts/gpu-check.sh "$OUT" 1024 32768
# The bench's environment passes through (BACKWARD=1, MASKS=..., see bench/gpu_bench.sh);
# PYTEST=0 leaves out the Python suite (3-4 minutes of a call, for a kernel-only iteration);
# PYTEST_ARGS picks part of it (e.g. "tests/python/test_plan.py", default the whole suite);
# BENCH_HEADS picks the protocol's head shapes (default "64:8 16:16");
# PYFRONT=1 adds bench/python_front_bench.py (the Python front's cost around the kernels);
# SANITIZE=0 leaves out compute-sanitizer (memcheck and racecheck on three small cases, memcheck
# also on the backward's head units; seconds on 2026-12-04; each must run its tests, not skip them); CTEST=0 leaves out ctest (100 s; for the
# Python suite or the sanitizers on a tree whose tests have passed in an earlier call).
# The device image has every build dependency but CUTLASS: carry .deps/cutlass (docs/gpu-host.md).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${1:-gpu-results}
shift || true
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
summary="$out/summary.txt"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  nvcc --version | tail -1
} > "$summary" 2>&1
# shellcheck source=scripts/gpu-build.sh
source scripts/gpu-build.sh  # build/gpu; sets `serialised`

# What the compiler made of the kernels: registers, spills, and the instructions that matter.
for obj in build/gpu/src/CMakeFiles/flexcp_objects.dir/__/generated/kernels/sm90/*.o; do
  sass=$(cuobjdump --dump-sass "$obj" 2>/dev/null)
  printf '%s: HGMMA %s, UTMALDG %s, LDL/STL %s, MUFU.EX2 %s, SETMAXREG %s\n' "$(basename "$obj")" \
    "$(grep -c HGMMA <<< "$sass")" "$(grep -c UTMALDG <<< "$sass")" \
    "$(grep -cE '\b(LDL|STL)\b' <<< "$sass")" "$(grep -c MUFU.EX2 <<< "$sass")" \
    "$(grep -c SETMAXREG <<< "$sass")"
  cuobjdump --dump-resource-usage "$obj" 2>/dev/null | grep -E "REG|STACK|SHARED" | head -2
done >> "$summary"

t0=$SECONDS
rc=0
if [[ ${CTEST:-1} != 0 ]]; then
  # CTEST_TIMEOUT: the default limit of a test in seconds (ctest --timeout), e.g. for a kernel
  # change that might hang; 240 or more, since Sm90Backward.LongVarlen (1M tokens) ran past 120
  # under -j 8 on an H100.
  ctest --test-dir build/gpu -j 8 --output-on-failure ${CTEST_TIMEOUT:+--timeout "$CTEST_TIMEOUT"} \
    > "$out/ctest.log" 2>&1
  rc=$?
  echo "ctest: rc $rc, $((SECONDS - t0)) s; $(grep -E 'tests passed|tests failed' "$out/ctest.log")" >> "$summary"
else
  echo "ctest: not run (CTEST=0)" | tee "$out/ctest.log" >> "$summary"
fi

# The Python suite on the CUDA build (the 1M-token backward included): the package's sources beside
# the module built above, so that the kernels are compiled once.
t0=$SECONDS
pkg=$(mktemp -d)
cp -r python/flexcp "$pkg/" && cp build/gpu/python/_flexcp*.so "$pkg/flexcp/"
if [[ ${PYTEST:-1} != 0 ]]; then
  # shellcheck disable=SC2086 # PYTEST_ARGS is a list of words
  PYTHONPATH=$pkg python3 -m pytest -q -rs ${PYTEST_ARGS:-tests/python} > "$out/pytest.log" 2>&1
  prc=$?
  ((prc == 0)) || rc=1
  echo "pytest: rc $prc, $((SECONDS - t0)) s; $(tail -1 "$out/pytest.log")" >> "$summary"
else
  echo "pytest: not run (PYTEST=0)" > "$out/pytest.log"
fi
# PYFRONT=1: what the PyTorch front costs around the kernels (mask, plan, CUDA graph; ~1 minute).
if [[ -n ${PYFRONT:-} ]]; then
  PYTHONPATH=$pkg python3 bench/python_front_bench.py --out "$out/python-front.md" \
    > "$out/python-front.log" 2>&1 || rc=1
  PYTHONPATH=$pkg python3 bench/python_host_overhead.py --device cuda \
    >> "$out/python-front.md" 2>> "$out/python-front.log" || rc=1
  PYTHONPATH=$pkg python3 bench/mask_from_pairs_bench.py --device cuda --lengths 4096 16384 \
    131072 >> "$out/python-front.md" 2>> "$out/python-front.log" || rc=1
  echo "python front bench: $((SECONDS - t0)) s (python-front.md)" >> "$summary"
fi

t0=$SECONDS
tools=(memcheck racecheck)
[[ ${SANITIZE:-1} != 0 ]] || tools=()
for tool in "${tools[@]}"; do
  # memcheck also runs the backward's head units (their partial slots, passed from unit to unit);
  # a run past 5 minutes is a hang, cut so that the call's other steps still run.
  filter='Sm90*.*FullyMaskedRowsAndEmptyMasks'
  [[ $tool == memcheck ]] && filter+=':Sm90Backward.HeadUnitsMatchTheReferenceAndRepeatBitForBit'
  timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 3 build/gpu/tests/cuda_tests \
    --gtest_filter="$filter" > "$out/sanitizer.log" 2>&1
  src=$?
  # A clean summary of tests that skipped (no device seen under the tool) checks nothing.
  ran=$(grep -oE '\[  PASSED  \] [0-9]+ test' "$out/sanitizer.log" | grep -oE '[0-9]+' || echo 0)
  if grep -q '\[  SKIPPED \]' "$out/sanitizer.log" || ((ran == 0)); then src=4; fi
  echo "compute-sanitizer $tool: rc $src, $ran tests passed; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitizer.log" | head -1)" >> "$summary"
  ((src == 0)) || { rc=1; cp "$out/sanitizer.log" "$out/sanitizer-$tool.log"; }
done
rm -f "$out/sanitizer.log"
echo "sanitizers: $((SECONDS - t0)) s" >> "$summary"

# The forward's softmax beside the kernel's other work (seconds; bench/README.md).
contention=build/gpu/bench/sm90_softmax_contention
if [[ -x $contention ]]; then
  "$contention" > "$out/softmax-contention.txt" 2>&1 || rc=1
  cat "$out/softmax-contention.txt" >> "$summary"
fi

# The kernel protocol (DESIGN §6): GQA 64:8 and MHA 16 heads, head dim 128, bf16. BENCH_HEADS
# keeps a part of it (e.g. "64:8", when a call's minutes hold only the goals' shape).
if (($#)); then
  t0=$SECONDS
  for heads in ${BENCH_HEADS:-64:8 16:16}; do
    IFS=: read -r h hk <<< "$heads"
    HEADS=$h HEADS_KV=$hk bench/gpu_bench.sh "$out" "$@" >> "$out/bench.log" 2>&1 ||
      { tail -20 "$out/bench.log"; rc=1; }
  done
  rm -f "$out"/gpu_bench_*.json  # the tables carry every figure; keeps what comes back small
  echo "bench: $((SECONDS - t0)) s" >> "$summary"
fi
grep -E "Failed|\*\*\*Failed|FAILED" "$out/ctest.log" "$out/pytest.log" | head -20
cat "$summary"
cat "$out"/gpu_bench_*.md 2>/dev/null
((serialised == 0)) || rc=1
exit $rc
