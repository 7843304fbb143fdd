#!/usr/bin/env bash
# FlashAttention-4 (the CuTe DSL kernels) for the GPU host, whose image lacks it and cannot reach
# PyPI: downloads the pinned wheels for its Python 3.12 / CUDA 13 here and splits them into two
# folders under DEST, each small enough to carry in one device call (the DSL's CUDA 13 library is
# a 92 MB wheel: it travels re-compressed, in parts). scripts/gpu-fa4.sh installs them there.
#   scripts/fa4-pack.sh .fa4          (a few minutes on 2 cores; .fa4 is ignored by git)
set -euo pipefail
dest=${1:?destination folder}
mkdir -p "$dest/a" "$dest/b"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
target=(--only-binary=:all: --python-version 3.12 --implementation cp
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
        --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
        --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps "${target[@]}" -d "$tmp" flash-attn-4==4.0.0b36 \
  nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1 \
  nvidia-cutlass-dsl-libs-cu13==4.8.1 apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5 \
  quack-kernels==0.6.5
# The large library wheel, unpacked and re-compressed (xz) in 30 MB parts: part aa in a, the rest
# and the other wheels in b.
mkdir "$tmp/lib" && (cd "$tmp/lib" && python3 -m zipfile -e ../nvidia_cutlass_dsl_libs_cu13-*.whl .)
rm "$tmp"/nvidia_cutlass_dsl_libs_cu13-*.whl
tar -cJf "$tmp/dsl.tar.xz" -C "$tmp/lib" .
split -b 30M "$tmp/dsl.tar.xz" "$tmp/dsl.part."
mv "$tmp/dsl.part.aa" "$dest/a/"
mv "$tmp"/dsl.part.a[b-z] "$tmp"/*.whl "$dest/b/" 2>/dev/null || mv "$tmp"/*.whl "$dest/b/"
du -sh "$dest/a" "$dest/b"
