#!/usr/bin/env bash
# Installs what flexcp builds and tests with on Debian 12 (DESIGN §5), quietly, and only what is
# missing: safe to run again. CUDA is optional and comes from /usr/local/cuda when present.
set -euo pipefail

packages=(cmake ninja-build g++ libomp-dev nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev
          libopenblas-dev clang-format libopenmpi-dev openmpi-bin)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "flexcp: installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi
