#!/usr/bin/env bash
# Distributed smoke benchmark (issue 4): `flexcp run` on 1, 2 and 4 ranks of this machine, same
# mask and sizes, one Markdown table. On 2 cores this shows overheads and how much of the K/V
# traffic hides behind compute, not scaling.
#   bench/dist_smoke.sh [out.md]   (run from the repository root after scripts/build.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/dist-$(date -u +%F).md}
cli=build/default/tools/flexcp/flexcp
args=(--seqlen 32768)  # the real document lengths that ship with flexcp
{
  echo "# Distributed smoke benchmark (CPU ranks over MPI)"
  echo
  echo "- date: $(date -u +%FT%H:%MZ); machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
  echo "- commit: $(git rev-parse --short HEAD); command: mpirun -np N flexcp run ${args[*]} (bf16, H=8, HK=2, D=128)"
  echo "- OMP threads per rank: cores / ranks; mpirun --bind-to none (Open MPI binds a lone rank to one core otherwise)"
  echo
  for n in 1 2 4; do
    threads=$(( $(nproc) / n )); (( threads >= 1 )) || threads=1
    echo "## $n rank(s)"
    echo '```'
    mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$n" -x OMP_NUM_THREADS="$threads" "$cli" run "${args[@]}"
    echo '```'
  done
} | tee "$out"
