#!/usr/bin/env bash
# Installs what flexcp builds and tests with on Debian 12 (DESIGN §5), quietly, and only what is
# missing: safe to run again. CUDA is optional and comes from /usr/local/cuda when present.
set -euo pipefail

packages=(cmake ninja-build g++ libomp-dev nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev
          libopenblas-dev clang-format libopenmpi-dev openmpi-bin clang libclang-rt-14-dev)
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

# CUTLASS/CuTe 4.2 headers for the Hopper kernels (DESIGN §5), from the pinned PyPI wheel, into
# .deps/cutlass/include. Only needed where nvcc is present.
cutlass_dir=$(cd "$(dirname "$0")/.." && pwd)/.deps/cutlass
if [[ -x /usr/local/cuda/bin/nvcc || -n "$(command -v nvcc)" ]] &&
   [[ ! -f "$cutlass_dir/include/cute/tensor.hpp" ]]; then
  echo "flexcp: fetching CUTLASS 4.2 headers (nvidia-cutlass==4.2.0.0)"
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: nvidia-cutlass==4.2.0.0 -d "$tmp"
  python3 - "$tmp" "$cutlass_dir" <<'PY'
import glob, os, shutil, sys, zipfile
wheel = glob.glob(os.path.join(sys.argv[1], "nvidia_cutlass-4.2.0.0-*.whl"))[0]
dest = sys.argv[2]
prefix = "cutlass_library/source/include/"
staging = dest + ".partial"
shutil.rmtree(staging, ignore_errors=True)
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            target = os.path.join(staging, "include", name[len(prefix):])
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with z.open(name) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
shutil.rmtree(dest, ignore_errors=True)
os.rename(staging, dest)
PY
  rm -rf "$tmp"
fi
