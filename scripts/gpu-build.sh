# Sourced by the GPU-host scripts (gpu-check.sh, gpu-dist.sh): configures and builds build/gpu with
# every core (the Python module included), logging to $out/build.log and the time to $summary,
# and sets `serialised` to the count of ptxas's wgmma-serialised warnings (C7520: a kernel that
# reads a wgmma accumulator on a branch; C7511: too few registers; C7510: a call): every wgmma of
# the function then waits for the one before, a silent slowdown (30x for C7520) that no test sees
# (src/kernels/sm90/README.md), so the callers fail on it. GPU_CMAKE_ARGS adds configure options
# (e.g. -DFLEXCP_SM90_DTYPES=bf16).
t0=$SECONDS
# The host keeps build/gpu between warm calls, but each call's tree is a fresh copy with the
# files' old times: a file changed back (a patch applied in an earlier call, then not) looks older
# than its outputs and ninja would keep the stale objects. So the build remembers each source's
# hash and touches those whose content changed since.
hashes=build/gpu/source-hashes.txt
sources() { find src include python cmake tests tools bench fuzz CMakeLists.txt -type f; }
if [[ -f $hashes ]]; then
  sha1sum --check --quiet "$hashes" 2>/dev/null | sed -n 's/: FAILED.*$//p' | xargs -r touch --
fi
# shellcheck disable=SC2086  # GPU_CMAKE_ARGS is a list of options
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLEXCP_BUILD_PYTHON=ON \
  ${GPU_CMAKE_ARGS:-} > "$out/build.log" 2>&1 &&
  cmake --build build/gpu -j "$(nproc)" >> "$out/build.log" 2>&1 ||
  { tail -40 "$out/build.log"; exit 1; }
sources | xargs -r sha1sum -- > "$hashes"
echo "build: $((SECONDS - t0)) s" >> "$summary"
serialised=$(grep -c "wgmma.mma_async instructions are serialized" "$out/build.log")
echo "ptxas wgmma-serialised warnings (C75xx): $serialised" >> "$summary"
