#!/usr/bin/env bash
# The whole test suite (README): installs dependencies, builds everything, runs ctest, runs it again
# under AddressSanitizer and UBSan, builds and tests the Python package (pip install . into .venv,
# pytest), builds the CPU-only mode, and checks the formatting. CUDA sources compile when nvcc is
# present; GPU tests skip without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
python=$(scripts/python-env.sh)  # first, so that ctest's torch comparisons find torch there
scripts/build.sh default
ctest --preset default -j "$(nproc)"
# Again under AddressSanitizer and UBSan (CPU only).
scripts/build.sh debug >/dev/null
ctest --preset debug -j "$(nproc)"
# The Python package (DESIGN §4): `pip install .` into its own environment, then pytest. Where no
# GPU is present its CUDA kernels are left out: the C++ build above compiles them already, and
# nothing here could run them.
cuda_define=()
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 ||
  cuda_define=(-Ccmake.define.FLEXCP_CUDA=OFF)
"$python" -m pip install -q --no-build-isolation -Cbuild-dir=build/python "${cuda_define[@]}" .
"$python" -m pytest -q tests/python
# The CPU-only build mode (DESIGN §5) must keep compiling too.
scripts/build.sh cpu flexcp flexcp_cli >/dev/null && echo "cpu-only build: ok"
scripts/check-format.sh
