#!/usr/bin/env bash
# On a GPU host: hunts a flaky GPU test. Repeats the ctest tests matching REGEX on this tree and,
# given a patch, on the tree with it applied (first), each while other GPU tests run beside it, as
# in a full `ctest -j 8`, where a test shares the GPU with others and its timing changes.
#   scripts/gpu-repeat.sh OUT REGEX [PATCH]        e.g. scripts/gpu-repeat.sh "$OUT" 'DistDevice\.nccl'
# REPEATS (default 12) runs each side until a failure; LOAD (default '^Sm90') is the ctest regex
# run in a loop beside them (LOAD= for none); SECONDS_EACH (default 150) bounds each side.
# Writes OUT/summary.txt (passes and failures per side) and OUT/{patched,tree}.log.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${1:?output folder}
regex=${2:?ctest regex}
patch=${3:-}
mkdir -p "$out"
summary=$out/summary.txt
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
limit=${SECONDS_EACH:-150}
load=${LOAD-^Sm90}

side() {  # name: build this tree as it is now, then repeat under load
  local name=$1 started=$SECONDS load_pid=
  (source scripts/gpu-build.sh) || { echo "$name: build failed" >> "$summary"; return 1; }
  if [[ -n $load ]]; then
    # shellcheck disable=SC2016 # the loop's $0 is the regex passed to it
    timeout "$limit" bash -c 'while :; do ctest --test-dir build/gpu -j 6 -R "$0" > /dev/null 2>&1; done' \
      "$load" &
    load_pid=$!
  fi
  timeout "$limit" ctest --test-dir build/gpu -R "$regex" --repeat "until-fail:${REPEATS:-12}" \
    --output-on-failure > "$out/$name.log" 2>&1
  local rc=$?
  if [[ -n $load_pid ]]; then  # the loop, and the ctest it may have left running
    kill "$load_pid" 2>/dev/null
    wait "$load_pid" 2>/dev/null
    pkill -f "ctest --test-dir build/gpu -j 6" 2>/dev/null
    sleep 2
  fi
  echo "$name: rc $rc in $((SECONDS - started)) s; $(grep -c ' Passed ' "$out/$name.log") passed," \
    "$(grep -cE '\*\*\*Failed|\(Failed\)' "$out/$name.log") failed" >> "$summary"
  grep -E 'Failure|Expected|Which is|Value of' "$out/$name.log" | head -12 >> "$summary"
}

date -u > "$summary"
if [[ -n $patch ]]; then
  git apply "$patch" || { echo "the patch does not apply" >> "$summary"; exit 1; }
  side patched
  git apply -R "$patch"
fi
side tree
cat "$summary"
