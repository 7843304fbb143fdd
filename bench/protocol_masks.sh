#!/usr/bin/env bash
# Writes the benchmark protocol's masks (DESIGN §6) with flexcp's own generators, one JSON file per
# mask and length, named MASK-LENGTH.json: the document masks pack the real document lengths that
# ship with flexcp. Shared by bench/gpu_bench.sh and scripts/gpu-ab.sh, so that both time the same
# masks.
#   bench/protocol_masks.sh CLI OUT_DIR lengths...
set -euo pipefail
cli=${1:?flexcp CLI}
out=${2:?output folder}
shift 2
mkdir -p "$out"
for t in "$@"; do
  mask() {  # name, then the generator's options
    local name=$1
    shift
    "$cli" mask --seqlen "$t" "$@" --out "$out/$name-$t.json" > /dev/null
  }
  mask full --mask full
  mask causal --mask causal
  mask varlen-full --mask varlen-full
  mask varlen-causal --mask varlen-causal
  mask swa1024 --mask sliding-window --window 1024
  # Not in DESIGN §6's list: the window where the backward's unit rule turns (bwd_units.cc).
  mask swa2048 --mask sliding-window --window 2048
  mask swa4096 --mask sliding-window --window 4096
  mask block-causal --mask block-causal --block 2048
  mask shared-question --mask shared-question --question $((t / 4 < 1024 ? t / 4 : 1024))
  mask prefix-lm --mask prefix-lm
done
