#!/usr/bin/env bash
# On a GPU host: Nsight Compute on one launch of the sm90 forward (or, with BACKWARD=1, the
# backward's main kernel) for a few protocol cases (bf16, head dim 128, GQA 64:8), clocks left to
# the GPU. Builds build/gpu first when needed. Writes one report per case under the folder given,
# plus the tensor-pipe metrics this ncu knows.
#   scripts/gpu-profile.sh OUT            BACKWARD=1 scripts/gpu-profile.sh OUT
# CASES names the cases to run (default: full-16k swa1024-32k causal-1k; full-4k, full-32k,
# causal-32k, varlen-causal-32k and swa4096-32k on request); CLI names another flexcp CLI to
# profile (e.g. scripts/gpu-ab.sh's build-ab/tools/flexcp/flexcp, built for bf16 and head dim 128
# only), instead of building build/gpu;
# PASSES=1 profiles instead the backward's three kernels of one call per case (the row statistics,
# the main kernel, the dq conversion): each one's time, DRAM bytes and share of DRAM's peak, the
# passes' cost beside the main kernel (bench/results/h100-2026-12-06.md section 14);
# SOURCE=1 adds the per-instruction stall samples (SourceCounters) and prints the hottest SASS
# lines (scripts/ncu-hot-sass.py); KEEP_CSV=1 also keeps every instruction's samples (gzip). With
# FA4_SITE (scripts/gpu-fa4.sh), FlashAttention-4's kernel is profiled the same way on the full
# and causal cases, in the same call (bench/fa4_profile_case.py), so that the two kernels'
# reports sit side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?output folder}
mkdir -p "$out"
cli=${CLI:-build/gpu/tools/flexcp/flexcp}
if [[ -z ${CLI:-} && ! -x $cli ]]; then
  cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > "$out/build.log" 2>&1
  cmake --build build/gpu -j "$(nproc)" >> "$out/build.log" 2>&1
fi
docs=()  # the real document lengths that ship with flexcp

# Metric names differ between ncu versions: take the tensor-pipe ones this one has.
known=$(ncu --query-metrics 2>/dev/null | awk '{print $1}')
grep -E '^sm__pipe_tensor_op_(gmma|hmma)_cycles_active$|^sm__inst_executed_pipe_tensor_op_(gmma|hmma)$' \
  <<< "$known" > "$out/tensor-metrics.txt" || true
metrics=$(sed 's/$/.avg.pct_of_peak_sustained_active/' "$out/tensor-metrics.txt" | paste -sd, -)

# Shared memory's own counters beside them: the LSU's wavefronts and bank conflicts (stores of dS
# and dQ, loads of statistics), and the instructions issued.
grep -E '^l1tex__data_pipe_lsu_wavefronts_mem_shared$|^l1tex__data_bank_conflicts_pipe_lsu_mem_shared$|^smsp__inst_executed$' \
  <<< "$known" > "$out/smem-metrics.txt" || true
metrics+=$(sed 's/$/.sum/' "$out/smem-metrics.txt" | paste -sd, - | sed 's/^./,&/')
metrics=${metrics#,}

kernel=fwd_kernel direction=() fa4_kernel=ForwardSm90
[[ -n "${BACKWARD:-}" ]] && kernel=bwd_kernel direction=(--backward) fa4_kernel=BackwardSm90
source=()
[[ -n "${SOURCE:-}" ]] && source=(--section SourceCounters --import-source no)
fa4_python=()
if [[ -n "${FA4_SITE:-}" ]]; then
  fa4_python=(env "PYTHONPATH=$FA4_SITE:$FA4_SITE/nvidia_cutlass_dsl/dsl_packages" python3
              bench/fa4_profile_case.py --heads 64 --heads-kv 8 ${BACKWARD:+--backward})
fi
# ncu_one NAME LABEL KERNEL_REGEX [ncu options] COMMAND...: one report (and its hot SASS lines).
ncu_one() {
  local name=$1 label=$2 regex=$3
  shift 3
  local log=$out/ncu-$label-$name.txt
  ncu --clock-control none --kernel-name "regex:$regex" --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section SchedulerStats --section WarpStateStats --section LaunchStats "${source[@]}" \
    ${metrics:+--metrics "$metrics"} ${source:+--export "$out/$label-$name" --force-overwrite} \
    "$@" > "$log" 2>&1 || echo "==ERROR ncu exited with $?" >> "$log"
  if [[ -n "${SOURCE:-}" && -f "$out/$label-$name.ncu-rep" ]]; then
    ncu --import "$out/$label-$name.ncu-rep" >> "$log" 2>&1  # the sections, as without export
    # Every instruction's samples (gzip, ~1 MB), read once; KEEP_CSV=1 keeps them for a reading
    # of the loop offline (scripts/ncu-hot-sass.py --loop).
    local table=$out/sass-$label-$name.csv.gz
    ncu --import "$out/$label-$name.ncu-rep" --page source --csv --print-source sass 2>&1 |
      gzip > "$table"
    zcat "$table" | python3 scripts/ncu-hot-sass.py 45 > "$out/hot-sass-$label-$name.txt" 2>&1
    [[ -n ${KEEP_CSV:-} ]] || rm -f "$table"
    rm -f "$out/$label-$name.ncu-rep"  # large; the hot lines are what comes back
  fi
}
profile() {
  local name=$1
  shift
  [[ " ${CASES:-full-16k swa1024-32k causal-1k} " == *" $name "* ]] || return 0
  if [[ -n ${PASSES:-} ]]; then  # the second backward's three kernels (the first warms up)
    ncu --clock-control none --kernel-name 'regex:bwd_preprocess|bwd_kernel|bwd_postprocess' \
      --launch-skip 3 --launch-count 3 --metrics gpu__time_duration.sum,dram__bytes_read.sum,\
dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed "$cli" bench \
      --device cuda --heads 64 --heads-kv 8 --head-dim 128 --warmup 1 --repeat 1 --only bwd "$@" \
      > "$out/ncu-passes-$name.txt" 2>&1 || echo "==ERROR ncu exited with $?" >> "$out/ncu-passes-$name.txt"
    return 0
  fi
  ncu_one "$name" "$kernel" "$kernel" --launch-skip 1 "$cli" bench --device cuda --heads 64 \
    --heads-kv 8 --head-dim 128 --warmup 1 --repeat 1 "${direction[@]}" "$@"
  # FA4 on the masks it takes as one sequence (full, causal).
  local mask=$2 seqlen=$4 causal=()
  [[ $mask == causal ]] && causal=(--causal)
  if ((${#fa4_python[@]})) && [[ $1 == --mask && ($mask == full || $mask == causal) ]]; then
    ncu_one "$name" "fa4-$fa4_kernel" "$fa4_kernel" --profile-from-start off \
      "${fa4_python[@]}" --seqlen "$seqlen" "${causal[@]}"
  fi
}
profile full-4k --mask full --seqlen 4096
profile full-16k --mask full --seqlen 16384
profile full-32k --mask full --seqlen 32768
profile causal-32k --mask causal --seqlen 32768
profile varlen-causal-32k --mask varlen-causal --seqlen 32768
profile swa1024-32k --mask sliding-window --window 1024 --seqlen 32768 "${docs[@]}"
profile swa4096-32k --mask sliding-window --window 4096 --seqlen 32768 "${docs[@]}"
profile causal-1k --mask causal --seqlen 1024
for f in "$out"/ncu-passes-*.txt; do
  [[ -f $f ]] || continue
  echo "== $(basename "$f")"
  grep -E "^  [a-z].*\(|gpu__time|dram__|==ERROR|No kernels" "$f" | sed 's/  */ /g'
done
[[ -n ${PASSES:-} ]] && exit 0
for f in "$out"/ncu-*.txt; do
  echo "== $(basename "$f")"
  grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|L1/TEX Cache Throughput|DRAM Throughput|L2 Cache Throughput|L2 Hit Rate|Memory Throughput|Shared Memory|Issue Slots Busy|Registers Per Thread|Active Warps Per Scheduler|No Eligible|sm__pipe|sm__inst|l1tex__data|smsp__inst|==ERROR|==WARNING|No kernels" "$f" || tail -5 "$f"
done
