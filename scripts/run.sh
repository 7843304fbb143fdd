#!/usr/bin/env bash
# The main job (README): builds the flexcp tool and runs distributed attention on 4 ranks
# (`mpirun -np 4 flexcp run`) over a 32K-token packed-document mask (the real document lengths that
# ship with flexcp), two layers sharing one plan, each checked against one rank.
# Extra arguments go to `flexcp run` (see `flexcp run --help`); FLEXCP_RANKS sets the rank count.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh default flexcp_cli >/dev/null
ranks=${FLEXCP_RANKS:-4}
# One OpenMP thread per rank when ranks share the cores.
threads=$(( $(nproc) / ranks )); (( threads >= 1 )) || threads=1
# -q: a failing rank's own message is the error; Open MPI's banners about the exit are left out.
exec mpirun -q --allow-run-as-root --oversubscribe --bind-to none -np "$ranks" \
  -x OMP_NUM_THREADS="$threads" build/default/tools/flexcp/flexcp run "$@"
