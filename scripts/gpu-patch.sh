#!/usr/bin/env bash
# On a GPU host, in one call: an experiment kept as a patch (bench/results/*.patch: work that has
# not run on a GPU lives on main as a patch, since branches do not outlast a session) checked and
# measured against the tree it applies to.
#   scripts/gpu-patch.sh PATCH OUT [lengths...]          (lengths default 32768 8192)
# PATCH may name several patches joined by commas (a.patch,b.patch): all are applied, and measured
# together as one change (one call where device minutes are short).
# 1. copies this tree (the patch not applied) to .ab-patch-base, the A/B's B;
# 2. applies the patch here and runs scripts/gpu-check.sh without the Python suite: OUT/check
#    (build, ptxas's C75xx count, the whole ctest), then, if that passed, OUT/sanitize
#    (compute-sanitizer memcheck and racecheck);
# 3. scripts/gpu-ab.sh .ab-patch-base OUT/ab: A = the patched tree; BACKWARD=1 by default
#    (BACKWARD= compares the forward; BACKWARD=both runs one A/B a direction, OUT/ab-fwd and
#    OUT/ab-bwd), ROUNDS=2, MASKS passes through;
# 4. with PHASES="case..." (e.g. "full-32k swa1024-32k"), scripts/gpu-phases.sh OUT/phases on
#    the patched tree.
# With SAME_BITS=1, for a patch meant to leave every result as it was: instead of steps 2-4, both
# trees' CLIs are built (bf16, head dim 128), scripts/gpu-same-bits.sh compares their outputs
# byte for byte (forward and deterministic backward), and the A/B runs in both directions
# (OUT/ab-fwd, OUT/ab-bwd; DIRECTIONS=fwd or bwd keeps one); about 6 device minutes at one length.
# About 8 device minutes with the defaults (check ~4, A/B ~2.5). The device copies the working
# tree anew on every call, so the patch is applied in the call that measures it.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
patch=${1:?patch file}
IFS=, read -r -a patches <<< "$patch"
label=$(for f in "${patches[@]}"; do basename "$f"; done | paste -sd+)
out=${2:?output folder}
shift 2
(($#)) || set -- 32768 8192  # the lengths
mkdir -p "$out"
base=.ab-patch-base
# The A/B once a direction: OUT/ab-fwd, OUT/ab-bwd (A_TREE passes through: the SAME_BITS path
# has built A in ./build-ab already).
ab_both() {
  local dir backward status=0
  for dir in ${DIRECTIONS:-fwd bwd}; do
    backward=
    [[ $dir == bwd ]] && backward=1
    BACKWARD=$backward ROUNDS=${ROUNDS:-2} A_LABEL="this tree + $label" \
      scripts/gpu-ab.sh "$base" "$out/ab-$dir" "$@" || status=1
  done
  return $status
}
rm -rf "$base" && mkdir -p "$base"
# build outputs stay behind (a warm host keeps build-ab from an earlier call, and CMake refuses a
# cache copied from another folder)
tar --exclude=./build --exclude=./build-ab --exclude=./.deps --exclude='./.ab-*' --exclude=./.git \
  --exclude=./.fa4 -cf - . | tar -xf - -C "$base"
for f in "${patches[@]}"; do
  git apply "$f" || { echo "gpu-patch: $f does not apply to this tree"; exit 2; }
done
echo "gpu-patch: $label applied; B is the tree without it ($base)"
if [[ -n ${SAME_BITS:-} ]]; then
  if ! A_TREE=. BUILD_ONLY=1 scripts/gpu-ab.sh "$base" "$out/build" > "$out/build.log" 2>&1; then
    tail -20 "$out/build.log"
    exit 1
  fi
  if ! BACKWARD=1 scripts/gpu-same-bits.sh build-ab/tools/flexcp/flexcp \
    "$base/build-ab/tools/flexcp/flexcp" "$out/bits"; then
    echo "gpu-patch: the patched tree's results differ; no A/B"
    exit 1
  fi
  A_TREE=. ab_both "$@"
  exit $?
fi
# The tests first, each cut at 240 s (the longest, Sm90Backward.LongVarlen, takes ~96 s alone and
# passed 120 s under ctest -j 8 on an H100 on 2026-12-06): a patch that hangs the kernel then fails
# here instead of spending the call, and the rest is skipped.
if ! CTEST_TIMEOUT=240 SANITIZE=0 PYTEST=0 scripts/gpu-check.sh "$out/check" \
  > "$out/check.log" 2>&1; then
  tail -25 "$out/check/summary.txt"
  grep -E "Failed|\*\*\*Failed|FAILED|Timeout" "$out/check/ctest.log" | head -10
  echo "gpu-patch: the patched tree fails its checks; no sanitizers, no A/B"
  exit 1
fi
rc=0
CTEST=0 PYTEST=0 scripts/gpu-check.sh "$out/sanitize" > "$out/sanitize.log" 2>&1 || rc=1
grep -E "^ctest|^compute-sanitizer|^ptxas" "$out/check/summary.txt" "$out/sanitize/summary.txt"
if [[ ${BACKWARD-1} == both ]]; then
  ab_both "$@" || rc=1
else
  BACKWARD=${BACKWARD-1} ROUNDS=${ROUNDS:-2} A_LABEL="this tree + $label" \
    scripts/gpu-ab.sh "$base" "$out/ab" "$@" || rc=1
fi
if [[ -n ${PHASES:-} ]]; then
  # shellcheck disable=SC2086  # PHASES is a list of cases
  scripts/gpu-phases.sh "$out/phases" $PHASES > "$out/phases.log" 2>&1 || rc=1
  grep -A3 -E "phases: cycles per block" "$out/phases.log" | head -40
fi
exit $rc
