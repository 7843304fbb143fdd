#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, in the `sanitize` preset's build: clang with AddressSanitizer
# and UBSan, CPU only; scripts/test.sh runs the test suite in the same build) and runs each for
# SECONDS seconds (default 20) from its seed corpus in fuzz/corpus/ (new inputs collect in
# build/sanitize/corpus/, kept between runs). A crash, a sanitizer report or a wrong result fails
# the script and leaves its input in build/sanitize/crashes/; each one found becomes a regression
# test (the input as a seed, and a case in the tests).
#   scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-20}
out=build/sanitize
[[ -f $out/build.ninja ]] || cmake --preset sanitize > /dev/null
mkdir -p $out
cmake --build $out --target fuzz_mask_json fuzz_npy fuzz_plan fuzz_row_runs fuzz_cli_args \
  > $out/fuzz-build.log 2>&1 || { grep -E -A12 "FAILED|error" $out/fuzz-build.log | head -60; exit 1; }
mkdir -p $out/crashes
for target in mask_json npy plan row_runs cli_args; do
  work=$out/corpus/$target
  mkdir -p "$work"
  if ! $out/fuzz/fuzz_$target -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 \
      -artifact_prefix="$out/crashes/$target-" "$work" "fuzz/corpus/$target" \
      > "$out/$target.log" 2>&1; then
    tail -40 "$out/$target.log"
    echo "fuzz: $target failed; its input is in $out/crashes/" >&2
    exit 1
  fi
  runs=$(grep -Eo 'Done [0-9]+ runs' "$out/$target.log" | grep -Eo '[0-9]+')
  echo "fuzz: $target: $runs runs in ${seconds} s, no failure"
done
