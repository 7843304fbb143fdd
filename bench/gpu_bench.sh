#!/usr/bin/env bash
# On the GPU host: writes the protocol masks of DESIGN §6 (bench/protocol_masks.sh), then times
# flexcp's forward and its peers on them in one run (bench/gpu_attention_bench.py). Needs a built
# flexcp tool (scripts/gpu-check.sh builds build/gpu).
#   bench/gpu_bench.sh OUT_DIR [lengths...]      (HEADS, HEADS_KV, HEAD_DIM, MASKS from the
#                                                environment; BACKWARD=1 times the backward too;
#                                                FA4_SITE adds FlashAttention-4: scripts/gpu-fa4.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?output folder}
shift
lengths=("${@:-4096 16384 32768}")
read -r -a lengths <<< "${lengths[*]}"
cli=build/gpu/tools/flexcp/flexcp
specs=$(mktemp -d)
bench/protocol_masks.sh "$cli" "$specs" "${lengths[@]}"
# MASKS (a glob, e.g. "{full,causal,varlen-causal}") keeps a subset.
if [[ -n "${MASKS:-}" ]]; then
  keep=$(mktemp -d)
  eval "cp $specs/${MASKS}-*.json $keep/"
  specs=$keep
fi
if [[ -n "${FA4_SITE:-}" ]]; then
  export PYTHONPATH=$FA4_SITE:$FA4_SITE/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
fi
python3 bench/gpu_attention_bench.py --flexcp "$cli" --specs "$specs" --out "$out" \
  --heads "${HEADS:-64}" --heads-kv "${HEADS_KV:-8}" --head-dim "${HEAD_DIM:-128}" \
  ${BACKWARD:+--backward}
