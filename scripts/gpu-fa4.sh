#!/usr/bin/env bash
# FlashAttention-4 as a benchmark peer on the GPU host, whose image lacks it. Here:
# `scripts/fa4-pack.sh .fa4` packs it into .fa4/a and .fa4/b (each small enough to carry).
# On the host, one call per part while the host stays warm (/tmp survives between calls):
#   scripts/gpu-fa4.sh .fa4/a        (carry .fa4/a: its files wait in /tmp/fa4w)
#   scripts/gpu-fa4.sh .fa4/b        (carry .fa4/b: installs into /tmp/fa4site and imports it)
# then `FA4_SITE=/tmp/fa4site bench/gpu_bench.sh ...` times FA4 and FlexAttention's FLASH backend.
set -euo pipefail
part=${1:?a carried part folder (.fa4/a or .fa4/b)}
stash=/tmp/fa4w site=/tmp/fa4site
mkdir -p "$stash"
cp "$part"/* "$stash"/
if ! ls "$stash"/*.whl >/dev/null 2>&1 || [[ ! -f "$stash/dsl.part.aa" ]]; then
  echo "fa4: $(ls "$stash" | wc -l) files waiting in $stash; carry the other part next"
  exit 0
fi
rm -rf "$site"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$stash"/*.whl
cat "$stash"/dsl.part.* | tar -xJ -C "$site"  # the DSL's CUDA 13 library over the wheels
PYTHONPATH=$site:$site/nvidia_cutlass_dsl/dsl_packages \
  python3 -c "from flash_attn.cute import flash_attn_func, flash_attn_varlen_func" &&
  echo "fa4: installed in $site (FA4_SITE=$site)"
