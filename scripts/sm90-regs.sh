#!/usr/bin/env bash
# Compile-only (no GPU): where one sm90 kernel instance's registers go. ptxas's report (registers,
# spill bytes, the wgmma-serialised warnings) and scripts/sass_live.py on its SASS (the peak of
# live registers, and each wgmma loop's length, spills and peak). Builds a copy of this working
# tree in .deps/regs (about 30 s an instance on 2 cores). The forward's configuration can be
# changed in that copy, never here, to see what a budget or a tile would cost before building it:
#   scripts/sm90-regs.sh INSTANCE          e.g. fwd_bf16_hd64 (names as scripts/sass-diff.sh's)
#   FWD_CONSUMERS=3 FWD_BLOCK_M=192 FWD_BLOCK_N_HD64=128 FWD_STAGES_HD64=4 FWD_PRODUCER_REGS=32 \
#     FWD_CONSUMER_REGS=160 scripts/sm90-regs.sh fwd_bf16_hd64
#     (three consumer groups at head dim 64, FlashAttention-4's shape there: it compiles, though
#     the kernel's turns and row layout are not yet written for it; bench/results/h100-2026-12-06.md
#     sections 36-37)
# PEAKS=N also lists the N stretches of highest register pressure. nvdisasm is the CUDA
# toolkit's, or else the `nvidia-cuda-nvdisasm` wheel's (fetched from PyPI into .deps/nvdisasm:
# the toolkit here ships none, and Triton's is too old to read CUDA 13's cubins).
set -euo pipefail
cd "$(dirname "$0")/.."
instance=${1:?instance, e.g. fwd_bf16_hd64}
[[ $instance =~ ^(fwd|bwd)_(bf16|fp16)_hd(64|128)$ ]] ||
  { echo "instance: '$instance'; expected {fwd,bwd}_{bf16,fp16}_hd{64,128}" >&2; exit 2; }
dtype=${BASH_REMATCH[2]} head_dim=${BASH_REMATCH[3]}
bash scripts/install-deps.sh
root=$PWD
# shellcheck source=scripts/cuobjdump.sh
source scripts/cuobjdump.sh  # sets `cuobjdump`
nvdisasm=$(command -v nvdisasm || true)
[[ -z $nvdisasm && -x /usr/local/cuda/bin/nvdisasm ]] && nvdisasm=/usr/local/cuda/bin/nvdisasm
if [[ -z $nvdisasm ]]; then
  nvdisasm=$root/.deps/nvdisasm/nvidia/cu13/bin/nvdisasm
  if [[ ! -x $nvdisasm ]]; then
    echo "fetching nvdisasm (the nvidia-cuda-nvdisasm wheel)" >&2
    tmp=$(mktemp -d)
    python3 -m pip download -q --no-deps --only-binary=:all: nvidia-cuda-nvdisasm==13.5.37 -d "$tmp"
    mkdir -p .deps/nvdisasm
    (cd .deps/nvdisasm && unzip -q -o "$tmp"/nvidia_cuda_nvdisasm-*.whl 'nvidia/cu13/bin/*')
    chmod +x "$nvdisasm"
    rm -rf "$tmp"
  fi
fi

work=$root/.deps/regs
copy=$work/tree
rm -rf "$copy"
mkdir -p "$copy"
git ls-files -co --exclude-standard -z | tar -c --null -T - | tar -x -C "$copy"
# NAME file pattern replacement: one change to the copy, which must match exactly once.
change() {
  local value=${!1:-}
  [[ -n $value ]] || return 0
  local n
  n=$(grep -c -- "$3" "$copy/$2" || true)
  ((n == 1)) || { echo "$1: '$3' matches $n lines of $2, expected 1" >&2; exit 2; }
  sed -i "s/$3/${4//@/$value}/" "$copy/$2"
  echo "$1=$value"
}
tiles=src/kernels/tiles.h config=src/kernels/sm90/fwd_config.cuh
change FWD_BLOCK_M "$tiles" 'kSm90BlockM = [0-9]*;' 'kSm90BlockM = @;'
change FWD_BLOCK_N_HD64 "$tiles" 'kSm90BlockNHd64 = [0-9]*;' 'kSm90BlockNHd64 = @;'
change FWD_CONSUMERS "$config" 'kConsumers = [0-9]*;' 'kConsumers = @;'
change FWD_PRODUCER_REGS "$config" 'kProducerRegs = [0-9]*;' 'kProducerRegs = @;'
change FWD_CONSUMER_REGS "$config" 'kConsumerRegs = [0-9]*;' 'kConsumerRegs = @;'
change FWD_STAGES_HD64 "$config" 'kStages = kHeadDim <= 64 ? [0-9]* :' 'kStages = kHeadDim <= 64 ? @ :'

build=$work/build-$dtype-$head_dim
cmake -S "$copy" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLEXCP_BUILD_TESTS=OFF \
  -DFLEXCP_BUILD_BENCH=OFF -DFLEXCP_CUTLASS_INCLUDE="$root/.deps/cutlass/include" \
  -DFLEXCP_SM90_DTYPES="$dtype" -DFLEXCP_SM90_HEAD_DIMS="$head_dim" \
  -DCMAKE_CUDA_FLAGS="-Xptxas -v" > "$work/cmake.log" 2>&1 || { tail -20 "$work/cmake.log"; exit 2; }
object=src/CMakeFiles/flexcp_objects.dir/__/generated/kernels/sm90/$instance.cu.o
rm -f "$build/$object"
ninja -C "$build" "$object" > "$work/ptxas.log" 2>&1 || { tail -20 "$work/ptxas.log"; exit 2; }
# The kernel's own lines (the instance's file also compiles host stubs with no registers).
grep -E "spill|Used [0-9]+ registers|C75[0-9][0-9]" "$work/ptxas.log" | grep -v "Used 0 registers" |
  sed 's/^ptxas info    : //'
cubins=$work/cubins
rm -rf "$cubins"
mkdir -p "$cubins"
(cd "$cubins" && "$cuobjdump" -xelf all "$build/$object" > /dev/null)
for cubin in "$cubins"/*.cubin; do
  "$nvdisasm" -plr -lrm count "$cubin" > "$cubin.sass"
  python3 scripts/sass_live.py "$cubin.sass" --peaks "${PEAKS:-0}"
done
