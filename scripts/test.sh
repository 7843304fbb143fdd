#!/usr/bin/env bash
# The whole test suite (README): installs dependencies, builds everything, runs ctest, runs it again
# under AddressSanitizer and UBSan (clang, CPU only), builds the Python package once (a wheel,
# without MPI) and tests it in .venv and under the oldest torch it accepts (.venv-torch2.4), runs
# the fuzzers for a minute in the sanitizer build, and checks the formatting. CUDA sources compile when nvcc is present; GPU tests skip without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
stage() { echo "test.sh: $1 done, $((SECONDS / 60)) min $((SECONDS % 60)) s in"; }
scripts/install-deps.sh
python=$(scripts/python-env.sh)  # first, so that ctest's torch comparisons find torch there
# Without a GPU nothing here can run the CUDA kernels: compile one dtype's instances (bf16; fp16
# is the same templates) to check that they build, and save the CI machine the other four. A GPU
# host builds and tests all of them (scripts/gpu-check.sh).
gpu=0
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && gpu=1
sm90_dtypes=$( ((gpu)) && echo "bf16;fp16" || echo "bf16")
cmake --preset default -DFLEXCP_SM90_DTYPES="$sm90_dtypes" >/dev/null
scripts/build.sh default
ctest --preset default -j "$(nproc)"
stage "build and ctest"
# Again under AddressSanitizer and UBSan (clang, CPU only); the fuzzers below use the same build.
scripts/build.sh sanitize >/dev/null
ctest --preset sanitize -j "$(nproc)"
stage "sanitizer build and ctest"
# The Python package (DESIGN §4): one wheel built in its own environment (`pip wheel`, what
# `pip install .` builds), installed and tested there, then the same wheel under the oldest torch
# it accepts (the module does not link torch, so one build serves every torch from 2.4 on). Where
# no GPU is present its CUDA kernels are left out: the C++ build above compiles them already, and
# nothing here could run them.
cuda_define=()
((gpu)) || cuda_define=(-Ccmake.define.FLEXCP_CUDA=OFF)
rm -rf build/wheel
"$python" -m pip wheel -q --no-build-isolation --no-deps -Cbuild-dir=build/python \
  "${cuda_define[@]}" -w build/wheel .
wheel=(build/wheel/flexcp-*.whl)
"$python" -m pip install -q --no-deps --force-reinstall "${wheel[0]}"
"$python" -m pytest -q tests/python
# The wheel's build is also the mode without MPI (pyproject.toml; CPU only where no GPU is
# present, DESIGN §5): its tool runs everything but the main job, which says what it needs.
cmake --build build/python --target flexcp_cli >/dev/null
no_mpi=$(build/python/tools/flexcp/flexcp run --seqlen 1024 --doc-len 256 2>&1) && rc=0 || rc=$?
if ((rc != 2)) || [[ $no_mpi != *"this build has no MPI"* ]]; then
  echo "the build without MPI: flexcp run exited $rc, expected 2 and the message: $no_mpi" >&2
  exit 1
fi
stage "wheel, Python tests and the build without MPI"
oldest=$(scripts/python-env.sh --oldest-torch)
"$oldest" -m pip install -q --no-deps --force-reinstall "${wheel[0]}"
echo "the same wheel under torch $("$oldest" -c "import torch; print(torch.__version__)"):"
"$oldest" -m pytest -q tests/python
stage "Python tests under the oldest torch"
# The fuzzers (fuzz/: the mask JSON reader, the .npy reader, the command line, the work lists and
# the planner on random slice sets), 15 s each under ASan and UBSan, in the sanitizer build (which
# is also the check that the CPU-only mode of DESIGN §5 compiles, here with clang).
scripts/fuzz.sh 15
stage "fuzzing"
scripts/check-format.sh
