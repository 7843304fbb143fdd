# Sourced by the GPU-host scripts (gpu-check.sh, gpu-dist.sh): configures and builds build/gpu with
# every core (the Python module included), logging to $out/build.log and the time to $summary,
# and sets `serialised` to the count of ptxas's wgmma-serialised warnings (C7520: a kernel that
# reads a wgmma accumulator on a branch; C7511: too few registers; C7510: a call): every wgmma of
# the function then waits for the one before, a silent slowdown (30x for C7520) that no test sees
# (src/kernels/sm90/README.md), so the callers fail on it. GPU_CMAKE_ARGS adds configure options
# (e.g. -DFLEXCP_SM90_DTYPES=bf16).
t0=$SECONDS
# shellcheck disable=SC2086  # GPU_CMAKE_ARGS is a list of options
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLEXCP_BUILD_PYTHON=ON \
  ${GPU_CMAKE_ARGS:-} > "$out/build.log" 2>&1 &&
  cmake --build build/gpu -j "$(nproc)" >> "$out/build.log" 2>&1 ||
  { tail -40 "$out/build.log"; exit 1; }
echo "build: $((SECONDS - t0)) s" >> "$summary"
serialised=$(grep -c "wgmma.mma_async instructions are serialized" "$out/build.log")
echo "ptxas wgmma-serialised warnings (C75xx): $serialised" >> "$summary"
