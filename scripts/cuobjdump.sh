# shellcheck shell=bash
# Sourced by the scripts that read machine code here (sass-diff.sh, fa4-sass.sh): sets `cuobjdump`
# to the CUDA toolkit's disassembler, or else to the one Triton's wheel carries (fetched from PyPI
# into .deps/cuobjdump once; the toolkit on the development machine ships none). Run from the
# repository root.
cuobjdump=$(command -v cuobjdump || true)
[[ -z $cuobjdump && -x /usr/local/cuda/bin/cuobjdump ]] && cuobjdump=/usr/local/cuda/bin/cuobjdump
if [[ -z $cuobjdump ]]; then
  cuobjdump=$PWD/.deps/cuobjdump/triton/backends/nvidia/bin/cuobjdump
  if [[ ! -x $cuobjdump ]]; then
    echo "fetching cuobjdump (Triton's wheel)" >&2
    tmp=$(mktemp -d)
    python3 -m pip download -q --no-deps --only-binary=:all: triton==3.5.0 -d "$tmp"
    mkdir -p .deps/cuobjdump
    (cd .deps/cuobjdump && unzip -q -o "$tmp"/triton-*.whl 'triton/backends/nvidia/bin/*')
    rm -rf "$tmp"
  fi
fi
