#!/usr/bin/env bash
# On the GPU host: writes the protocol masks of DESIGN §6 with flexcp's own generators, then times
# the peers on them (bench/gpu_peers.py). Needs a built flexcp tool (scripts/gpu-check.sh builds
# build/gpu).   bench/gpu_peers.sh OUT_DIR [lengths...]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?output folder}
shift
lengths=("${@:-4096 16384 32768}")
read -r -a lengths <<< "${lengths[*]}"
cli=build/gpu/tools/flexcp/flexcp
specs=$(mktemp -d)
docs=(--doc-lens shared-data/doclens_perl_modules.txt)
for t in "${lengths[@]}"; do
  $cli mask --mask full --seqlen "$t" --out "$specs/full-$t.json" >/dev/null
  $cli mask --mask causal --seqlen "$t" --out "$specs/causal-$t.json" >/dev/null
  $cli mask --mask varlen-full --seqlen "$t" "${docs[@]}" --out "$specs/varlen-full-$t.json" >/dev/null
  $cli mask --mask varlen-causal --seqlen "$t" "${docs[@]}" --out "$specs/varlen-causal-$t.json" >/dev/null
  $cli mask --mask sliding-window --window 1024 --seqlen "$t" "${docs[@]}" --out "$specs/swa1024-$t.json" >/dev/null
  $cli mask --mask sliding-window --window 4096 --seqlen "$t" "${docs[@]}" --out "$specs/swa4096-$t.json" >/dev/null
  $cli mask --mask block-causal --block 2048 --seqlen "$t" "${docs[@]}" --out "$specs/block-causal-$t.json" >/dev/null
  $cli mask --mask shared-question --question 1024 --seqlen "$t" "${docs[@]}" --out "$specs/shared-question-$t.json" >/dev/null
  $cli mask --mask prefix-lm --seqlen "$t" "${docs[@]}" --out "$specs/prefix-lm-$t.json" >/dev/null
done
python3 bench/gpu_peers.py --specs "$specs" --out "$out"
