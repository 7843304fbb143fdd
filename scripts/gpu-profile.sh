#!/usr/bin/env bash
# On a GPU host: Nsight Compute on one launch of the sm90 forward (or, with BACKWARD=1, the
# backward's main kernel) for a few protocol cases (bf16, head dim 128, GQA 64:8), clocks left to
# the GPU. Builds build/gpu first when needed. Writes one report per case under the folder given,
# plus the tensor-pipe metrics this ncu knows.
#   scripts/gpu-profile.sh OUT            BACKWARD=1 scripts/gpu-profile.sh OUT
# CASES names the cases to run (default: all three); SOURCE=1 adds the per-instruction stall
# samples (SourceCounters) and prints the hottest SASS lines (scripts/ncu-hot-sass.py).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?output folder}
mkdir -p "$out"
if [[ ! -x build/gpu/tools/flexcp/flexcp ]]; then
  cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > "$out/build.log" 2>&1
  cmake --build build/gpu -j "$(nproc)" >> "$out/build.log" 2>&1
fi
cli=build/gpu/tools/flexcp/flexcp
docs=()  # the real document lengths that ship with flexcp

# Metric names differ between ncu versions: take the tensor-pipe ones this one has.
ncu --query-metrics 2>/dev/null | awk '{print $1}' |
  grep -E '^sm__pipe_tensor_op_(gmma|hmma)_cycles_active$|^sm__inst_executed_pipe_tensor_op_(gmma|hmma)$' \
    > "$out/tensor-metrics.txt" || true
metrics=$(sed 's/$/.avg.pct_of_peak_sustained_active/' "$out/tensor-metrics.txt" | paste -sd, -)

kernel=fwd_kernel direction=()
[[ -n "${BACKWARD:-}" ]] && kernel=bwd_kernel direction=(--backward)
source=()
[[ -n "${SOURCE:-}" ]] && source=(--section SourceCounters --import-source no)
profile() {
  local name=$1
  shift
  [[ " ${CASES:-$name} " == *" $name "* ]] || return 0
  local log=$out/ncu-$kernel-$name.txt
  ncu --clock-control none --kernel-name regex:$kernel --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section SchedulerStats --section WarpStateStats "${source[@]}" \
    ${metrics:+--metrics "$metrics"} ${source:+--export "$out/$name" --force-overwrite} \
    "$cli" bench --device cuda --heads 64 --heads-kv 8 --head-dim 128 --warmup 1 --repeat 1 \
    "${direction[@]}" "$@" > "$log" 2>&1 || echo "==ERROR ncu exited with $?" >> "$log"
  if [[ -n "${SOURCE:-}" && -f "$out/$name.ncu-rep" ]]; then
    ncu --import "$out/$name.ncu-rep" >> "$log" 2>&1  # the sections' details, as without export
    ncu --import "$out/$name.ncu-rep" --page source --csv --print-source sass 2>&1 |
      python3 scripts/ncu-hot-sass.py 45 > "$out/hot-sass-$kernel-$name.txt" 2>&1
    rm -f "$out/$name.ncu-rep"  # large; the hot lines are what comes back
  fi
}
profile full-16k --mask full --seqlen 16384
profile swa1024-32k --mask sliding-window --window 1024 --seqlen 32768 "${docs[@]}"
profile causal-1k --mask causal --seqlen 1024
for f in "$out"/ncu-*.txt; do
  echo "== $(basename "$f")"
  grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|DRAM Throughput|L2 Cache Throughput|Issue Slots Busy|Active Warps Per Scheduler|No Eligible|sm__pipe|sm__inst|==ERROR|==WARNING" "$f" || tail -5 "$f"
done
