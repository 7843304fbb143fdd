#!/usr/bin/env bash
# The main job (README): builds the flexcp tool and runs `flexcp run` on a packed-document mask.
# Extra arguments go to `flexcp run` (see `flexcp run --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh default flexcp_cli >/dev/null
doc_lens=../shared/data/doclens_perl_modules.txt
if [[ -f $doc_lens ]]; then
  exec build/default/tools/flexcp/flexcp run --doc-lens "$doc_lens" "$@"
else
  echo "flexcp: $doc_lens not found; packing equal 2048-token documents instead" >&2
  exec build/default/tools/flexcp/flexcp run --doc-len 2048 "$@"
fi
