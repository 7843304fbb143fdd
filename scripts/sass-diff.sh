#!/usr/bin/env bash
# Compares the machine code (SASS) of sm90 kernel instances in this tree with another commit's,
# with register numbers and addresses masked: a change that leaves it equal (a refactor, a moved
# function) changes neither results nor speed, which a machine without a GPU can show. Compiles
# only the instances named (CUDA compile-only; about a minute each on 2 cores), in
# .deps/sass/{base,tree}, and exits 1 when any differs.
#   scripts/sass-diff.sh BASE_REV [instance...]   e.g. scripts/sass-diff.sh HEAD fwd_bf16_hd128
# Instances are named as the generated files: {fwd,bwd}_{bf16,fp16}_hd{64,128} (default: all
# eight). cuobjdump is the CUDA toolkit's, or else the one Triton's wheel carries (fetched from
# PyPI into .deps/cuobjdump; the toolkit here ships no disassembler).
set -euo pipefail
cd "$(dirname "$0")/.."
base_rev=${1:?base revision}
shift
instances=("$@")
((${#instances[@]})) || instances=({fwd,bwd}_{bf16,fp16}_hd{64,128})
bash scripts/install-deps.sh
root=$PWD
work=$root/.deps/sass
mkdir -p "$work"

# shellcheck source=scripts/cuobjdump.sh
source scripts/cuobjdump.sh  # sets `cuobjdump`

base_src=$work/base-src
rm -rf "$base_src"
mkdir -p "$base_src"
git archive "$base_rev" | tar -x -C "$base_src"

objects() {  # source dir, build dir: compiles the instances' objects
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLEXCP_BUILD_TESTS=OFF \
    -DFLEXCP_BUILD_BENCH=OFF -DFLEXCP_CUTLASS_INCLUDE="$root/.deps/cutlass/include" \
    -DFLEXCP_SM90_DTYPES="bf16;fp16" -DFLEXCP_SM90_HEAD_DIMS="64;128" > "$2.log" 2>&1 ||
    { tail -20 "$2.log"; exit 2; }
  local targets=()
  for i in "${instances[@]}"; do
    targets+=("src/CMakeFiles/flexcp_objects.dir/__/generated/kernels/sm90/$i.cu.o")
  done
  ninja -C "$2" "${targets[@]}" >> "$2.log" 2>&1 || { tail -20 "$2.log"; exit 2; }
}
objects "$base_src" "$work/base"
objects "$root" "$work/tree"

sass() {  # object -> its SASS, one instruction a line, registers and addresses masked
  "$cuobjdump" --dump-sass "$1" 2>/dev/null | grep -E '^\s+/\*[0-9a-f]{4,6}\*/|Function :' |
    sed -E 's#/\*[0-9a-f]+\*/##; s#;.*##; s/0x[0-9a-f]{4,}/ADDR/g; s/\bU?R[0-9]+\b/REG/g'
}
rc=0
for i in "${instances[@]}"; do
  o=src/CMakeFiles/flexcp_objects.dir/__/generated/kernels/sm90/$i.cu.o
  a=$(sass "$work/base/$o") b=$(sass "$work/tree/$o")
  if [[ "$a" == "$b" ]]; then
    echo "$i: identical ($(wc -l <<< "$a") lines of SASS)"
  else
    rc=1
    echo "$i: DIFFERS ($(wc -l <<< "$a") -> $(wc -l <<< "$b") lines)"
    diff <(echo "$a") <(echo "$b") | head -20 || true
  fi
done
exit $rc
