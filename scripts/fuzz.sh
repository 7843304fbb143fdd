#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, the `fuzz` preset: clang with AddressSanitizer and UBSan,
# CPU only, without MPI) and runs each for SECONDS seconds (default 20) from its seed corpus in fuzz/corpus/
# (new inputs collect in build/fuzz/corpus/, kept between runs). A crash, a sanitizer report or
# a wrong result fails the script and leaves its input in build/fuzz/crashes/; each one found
# becomes a regression test (the input as a seed, and a case in the tests).
#   scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-20}
cmake --preset fuzz > /dev/null
mkdir -p build/fuzz
cmake --build build/fuzz --target fuzz_mask_json fuzz_npy fuzz_plan fuzz_cli_args flexcp_cli \
  > build/fuzz/build.log 2>&1 || { grep -E -A12 "FAILED|error" build/fuzz/build.log | head -60; exit 1; }
# The preset also builds without MPI (-DFLEXCP_WITH_MPI=OFF): everything but the main job works,
# and the main job says what it needs.
no_mpi=$(build/fuzz/tools/flexcp/flexcp run --seqlen 1024 --doc-len 256 2>&1) && rc=0 || rc=$?
if ((rc != 2)) || [[ $no_mpi != *"this build has no MPI"* ]]; then
  echo "the build without MPI: flexcp run exited $rc, expected 2 and the message: $no_mpi" >&2
  exit 1
fi
echo "cpu-only build without MPI (clang, the fuzz preset): ok"
mkdir -p build/fuzz/crashes
for target in mask_json npy plan cli_args; do
  work=build/fuzz/corpus/$target
  mkdir -p "$work"
  if ! build/fuzz/fuzz/fuzz_$target -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 \
      -artifact_prefix="build/fuzz/crashes/$target-" "$work" "fuzz/corpus/$target" \
      > "build/fuzz/$target.log" 2>&1; then
    tail -40 "build/fuzz/$target.log"
    echo "fuzz: $target failed; its input is in build/fuzz/crashes/" >&2
    exit 1
  fi
  echo "fuzz: $target: $(grep -Eo '#[0-9]+' "build/fuzz/$target.log" | tail -1 | tr -d '#') runs in ${seconds} s, no failure"
done
