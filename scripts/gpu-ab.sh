#!/usr/bin/env bash
# A/B of the GPU forward (or, with BACKWARD=1, the backward) on a GPU host: this tree's flexcp against another checkout's (a copy of an
# earlier commit, e.g. `git worktree add /tmp/base COMMIT`, copied into an ignored folder and
# carried), on the same protocol masks, alternating A and B for ROUNDS rounds so that clock drift
# and heat hit both alike. Needs build/gpu (scripts/gpu-check.sh builds it). Prints one line per
# mask: TFLOPS of A and B (median over rounds), A/B, and each side's SM clock (median over rounds
# of the mean over a call's timed runs).
#   scripts/gpu-ab.sh BASE_TREE OUT [lengths...]
# A_TREE (optional) builds A from another tree as B is built (e.g. two branches carried as ignored
# folders, each against main's, in one call), instead of this tree's build/gpu.
# From the environment: HEADS, HEADS_KV, HEAD_DIM (128 unless set; both CLIs are built for it),
# ROUNDS, SAMPLES (per call, 35 after 500 ms of warm-up: the GPU meets its power limit first, as
# in training and in bench/gpu_bench.sh), MASKS (names of
# bench/protocol_masks.sh; default "full causal varlen-causal swa1024"), A_LABEL (the device
# copy's .git may be older than its tree: say which commit A is),
# BUILD_ONLY=1 (build both CLIs, print their paths, time nothing), B_CMAKE_ARGS (B's build
# options: with BASE_TREE `.`, this tree against itself built another way, e.g.
# B_CMAKE_ARGS=-DFLEXCP_SM90_HEAD_DIMS=64), A_ENV and B_ENV (variables each side runs with;
# with BASE_TREE `-`, B is A's own binary, e.g. A_ENV=FLEXCP_SM90_BWD_WALK=from-last
# B_ENV=FLEXCP_SM90_BWD_WALK=heads-outer: one binary, so no difference between builds).
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?base tree}
out=${2:?output folder}
shift 2
lengths=("${@:-32768}")
read -r -a lengths <<< "${lengths[*]}"
mkdir -p "$out"
heads=${HEADS:-64} heads_kv=${HEADS_KV:-8} head_dim=${HEAD_DIM:-128} rounds=${ROUNDS:-3}
samples=${SAMPLES:-35}
masks=${MASKS:-full causal varlen-causal swa1024}
label=${A_LABEL:-$(git rev-parse --short HEAD 2>/dev/null)}
# tree cmake-args -> the path of its CLI, built in tree/build-ab (bf16, the one head dim).
build_cli() {
  # shellcheck disable=SC2086  # the options are a list
  if ! cmake -S "$1" -B "$1/build-ab" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DFLEXCP_BUILD_TESTS=OFF -DFLEXCP_BUILD_BENCH=OFF -DFLEXCP_SM90_DTYPES=bf16 \
    -DFLEXCP_SM90_HEAD_DIMS="$head_dim" -DFLEXCP_CUTLASS_INCLUDE="$PWD/.deps/cutlass/include" \
    $2 >> "$out/ab-build.log" 2>&1 ||
    ! cmake --build "$1/build-ab" -j "$(nproc)" --target flexcp_cli >> "$out/ab-build.log" 2>&1; then
    tail -30 "$out/ab-build.log" >&2
    return 1
  fi
  echo "$1/build-ab/tools/flexcp/flexcp"
}
: > "$out/ab-build.log"
a=build/gpu/tools/flexcp/flexcp
if [[ -n ${A_TREE:-} ]]; then  # A from another tree (e.g. one branch of several, carried)
  a=$(build_cli "$A_TREE" "") || exit 1
  label="${A_LABEL:-$A_TREE} (built from $A_TREE)"
else
  label="$label (this tree)"
fi
b=$a
if [[ $base != - ]]; then
  b=$(build_cli "$base" "${B_CMAKE_ARGS:-}") || exit 1
fi
if [[ -n ${BUILD_ONLY:-} ]]; then  # the two CLIs, for a check before the timing
  echo "A: $a"
  echo "B: $b"
  exit 0
fi
specs=$(mktemp -d)
bench/protocol_masks.sh "$a" "$specs" "${lengths[@]}"
names=()
for t in "${lengths[@]}"; do
  for m in $masks; do
    [[ -f $specs/$m-$t.json ]] || { echo "MASKS: no protocol mask '$m' (bench/protocol_masks.sh)" >&2; exit 2; }
    names+=("$m-$t")
  done
done
dir=fwd
[[ -n "${BACKWARD:-}" ]] && dir=bwd
# Only the direction compared is timed (`bench --only`); a build older than that option times
# the forward and, for the backward, all three directions.
direction_flags() {  # cli -> its bench options for the direction compared
  if "$1" bench --help | grep -q -- --only; then
    echo "--only $dir"
  elif [[ $dir == bwd ]]; then
    echo --backward
  fi
}
a_flags=$(direction_flags "$a") b_flags=$(direction_flags "$b")
# variables cli flags spec -> "TFLOPS MHz" of one bench call, in the direction compared: the SM
# clock is the mean over the call's timed runs (the window the tool prints; its busy samples for a
# build from before the windows; bench/gpu_clocks.py; 0 where NVML cannot be read), so that a
# ratio says whether it comes from cycles or from the clock.
tflops() {
  # shellcheck disable=SC2086  # the variables and the flags are lists
  env $1 python3 bench/gpu_clocks.py "$2" bench --device cuda --mask-file "$4" --heads "$heads" \
    --heads-kv "$heads_kv" --head-dim "$head_dim" --dtype bf16 --warmup 3 --warmup-ms 500 \
    --repeat "$samples" $3 |
    awk -v dir="$dir" '
      $0 ~ " dir=" dir " " && match($0, /TFLOPS=[0-9.]+/) { t = substr($0, RSTART + 7, RLENGTH - 7) }
      /^clocks: / && match($0, /mhz=[0-9]+/) { m = substr($0, RSTART + 4, RLENGTH - 4) }
      END { print (t == "" ? "failed" : t), (m == "" ? 0 : m) }'  # two fields even when a call fails
}
# The middle value; with an even count, the mean of the middle two (not the lower one).
median() {
  tr ' ' '\n' | sort -g |
    awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'
}
{
  echo "A: $label ${A_ENV:-}, B: $base ${B_ENV:-}; $dir, GQA $heads:$heads_kv, hd$head_dim, bf16, $rounds rounds"
  printf '%-22s %10s %10s %8s %7s %7s   %s\n' mask "A TFLOPS" "B TFLOPS" "A/B" "A MHz" "B MHz" \
    "rounds (A B)"
  for n in "${names[@]}"; do
    as=() bs=() ac=() bc=()
    for ((r = 0; r < rounds; ++r)); do
      read -r t m <<< "$(tflops "${A_ENV:-}" "$a" "$a_flags" "$specs/$n.json")"
      as+=("$t") ac+=("$m")
      read -r t m <<< "$(tflops "${B_ENV:-}" "$b" "$b_flags" "$specs/$n.json")"
      bs+=("$t") bc+=("$m")
    done
    ma=$(echo "${as[*]}" | median) mb=$(echo "${bs[*]}" | median)
    printf '%-22s %10.1f %10.1f %8.3f %7.0f %7.0f   %s | %s\n' "$n" "$ma" "$mb" \
      "$(awk -v a="$ma" -v b="$mb" 'BEGIN {print a / b}')" "$(echo "${ac[*]}" | median)" \
      "$(echo "${bc[*]}" | median)" "${as[*]}" "${bs[*]}"
  done
} | tee "$out/ab.txt"
