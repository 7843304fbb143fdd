#!/usr/bin/env bash
# The whole test suite (README): installs dependencies, builds everything, runs ctest, runs it again
# under AddressSanitizer and UBSan, builds the CPU-only mode, and checks the formatting. CUDA sources compile when nvcc is present; GPU tests skip without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh default
ctest --preset default -j "$(nproc)"
# Again under AddressSanitizer and UBSan (CPU only).
scripts/build.sh debug >/dev/null
ctest --preset debug -j "$(nproc)"
# The CPU-only build mode (DESIGN §5) must keep compiling too.
scripts/build.sh cpu flexcp flexcp_cli >/dev/null && echo "cpu-only build: ok"
scripts/check-format.sh
