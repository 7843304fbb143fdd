#!/usr/bin/env bash
# On a GPU host: where the kernels' block loops spend their cycles (src/kernels/sm90/phase_clock.cuh).
# Builds build/trace (bf16, head dim 128 only, FLEXCP_SM90_PHASE_CLOCKS on), runs one forward and
# backward per case (GQA 64:8, or HEADS and HEADS_KV from the environment) and prints, per
# consumer group of the first CTAs, each phase's cycles per block and its share of the group's
# cycles, then a timeline of 16 blocks of CTA 0: when each group ended each phase, side by side
# (scripts/phases.py).
#   scripts/gpu-phases.sh OUT [case...]    a case: a mask of bench/protocol_masks.sh and a length,
#                                          e.g. swa1024-32k (default: full-4k causal-4k full-32k
#                                          causal-32k varlen-causal-32k)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?output folder}
shift
cases=("${@:-full-4k causal-4k full-32k causal-32k varlen-causal-32k}")
read -r -a cases <<< "${cases[*]}"
mkdir -p "$out"
cmake -S . -B build/trace -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLEXCP_BUILD_TESTS=OFF \
  -DFLEXCP_BUILD_BENCH=OFF -DFLEXCP_SM90_DTYPES=bf16 -DFLEXCP_SM90_HEAD_DIMS=128 \
  -DCMAKE_CUDA_FLAGS=-DFLEXCP_SM90_PHASE_CLOCKS > "$out/trace-build.log" 2>&1
cmake --build build/trace -j "$(nproc)" --target flexcp_cli >> "$out/trace-build.log" 2>&1 ||
  { tail -30 "$out/trace-build.log"; exit 1; }
grep -E "C75" "$out/trace-build.log" | head -5 || true
cli=build/trace/tools/flexcp/flexcp
specs=$(mktemp -d)
for c in "${cases[@]}"; do
  mask=${c%-*} len=${c##*-}
  len=$((${len%k} * 1024))
  echo "== $c"
  [[ -f $specs/$mask-$len.json ]] || bench/protocol_masks.sh "$cli" "$specs" "$len"
  [[ -f $specs/$mask-$len.json ]] || { echo "no protocol mask '$mask' (bench/protocol_masks.sh)"; continue; }
  "$cli" bench --device cuda --heads "${HEADS:-64}" --heads-kv "${HEADS_KV:-8}" --head-dim 128 \
    --warmup 0 --repeat 1 --backward --mask-file "$specs/$mask-$len.json" > "$out/phases-$c.txt" 2>&1 ||
    { tail -5 "$out/phases-$c.txt"; continue; }
  python3 scripts/phases.py < "$out/phases-$c.txt"
done
