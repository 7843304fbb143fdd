#!/usr/bin/env bash
# Configures (once) and builds flexcp with a CMake preset: `scripts/build.sh [preset] [targets...]`.
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-default}
shift || true
if [[ ! -f build/$preset/build.ninja ]]; then
  cmake --preset "$preset" >/dev/null
fi
if (($#)); then
  cmake --build "build/$preset" --target "$@"
else
  cmake --build "build/$preset"
fi
