#!/usr/bin/env bash
# DistAttention over NCCL on every GPU of a host with several (one process per GPU), in one call:
#   1. the topology (`nvidia-smi topo -m`);
#   2. correctness: the GPU runtime's tests with one process per GPU over NCCL (DeviceComm,
#      DistDevice: forward and backward equal one GPU, bytes equal the plan), `flexcp run --device
#      cuda` checked against one GPU, and a killed rank ending every rank with an error in bounded
#      time;
#   3. weak scaling: `flexcp run --timing` on 1, 2, 4, 8 GPUs (those present) with TOKENS tokens
#      per GPU, GQA 64:8 (16:2 from 512K tokens per GPU, so that one layer's tensors and scratch
#      fit), hd128, bf16, on causal, varlen causal (the real document lengths that ship with
#      flexcp), sliding window 1024 in documents and prefix-LM (the multimodal prefix); each line
#      the slowest rank's time per direction against the ranks' kernels on their own work;
#   4. the peer in the same run: torch's context parallelism (bench/torch_cp_bench.py, the ring
#      over SDPA) on causal, where the global q/k/v fit on one GPU.
# Results under OUT; summary.txt collects one line per case.
#   bench/gpu_scaling.sh OUT [tokens per GPU...]      (default 32768 65536 131072)
# Carry .deps/cutlass (docs/gpu-host.md); needs 2+ GPUs.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${1:-gpu-results}
shift || true
read -r -a per_gpu <<< "${*:-32768 65536 131072}"
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
summary="$out/summary.txt"
date -u > "$summary"
gpus=$(nvidia-smi -L | wc -l)
nvidia-smi topo -m > "$out/topo.txt" 2>&1
echo "GPUs: $gpus ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1))" >> "$summary"
((gpus >= 2)) || { echo "needs 2 or more GPUs, found $gpus" | tee -a "$summary"; exit 1; }
# shellcheck source=scripts/gpu-build.sh
source scripts/gpu-build.sh  # build/gpu; sets `serialised`
cli=build/gpu/tools/flexcp/flexcp
mpi=(mpirun --allow-run-as-root --oversubscribe -x NCCL_NVLS_ENABLE=0
  -x TORCH_SYMM_MEM_DISABLE_MULTICAST=1 -x NVSHMEM_DISABLE_NVLS=1 -x OMP_NUM_THREADS=4)
counts=()
for n in 2 4 8; do ((n <= gpus)) && counts+=("$n"); done
rc=0

for n in "${counts[@]}"; do
  for t in device_comm_tests dist_device_tests; do
    timeout 600 "${mpi[@]}" -np "$n" "build/gpu/tests/$t" --backend nccl > "$out/$t-nccl-$n.log" 2>&1
    r=$?
    ((r == 0)) || rc=1
    echo "$t --backend nccl, $n ranks: rc $r; $(grep -hE 'PASSED|FAILED' "$out/$t-nccl-$n.log" |
      sort | uniq -c | tr '\n' ' ')" >> "$summary"
  done
  timeout 900 "${mpi[@]}" -np "$n" $cli run --device cuda --comm nccl --seqlen $((32768 * n)) \
    --heads 64 --heads-kv 8 --head-dim 128 --layers 2 > "$out/run-check-$n.log" 2>&1
  r=$?
  ((r == 0)) || rc=1
  echo "flexcp run --device cuda --comm nccl -np $n: rc $r; $(grep -cE ': ok$' \
    "$out/run-check-$n.log") of 2 layers match one GPU" >> "$summary"
done
# A killed rank over NCCL: every rank ends with an error within the time-out, none hangs.
t0=$SECONDS
timeout 120 "${mpi[@]}" -np "$gpus" -x FLEXCP_COMM_TIMEOUT_S=5 build/gpu/tests/dist_device_failure \
  die nccl > "$out/killed-rank-nccl.log" 2>&1
r=$?
echo "killed rank over NCCL, $gpus ranks: rc $r (expected non-zero, not 124) after $((SECONDS - t0)) s" \
  >> "$summary"
((r != 0 && r != 124)) || rc=1

# Weak scaling: per-GPU tokens fixed, the sequence grows with the GPUs.
for t in "${per_gpu[@]}"; do
  heads=(--heads 64 --heads-kv 8)
  ((t >= 524288)) && heads=(--heads 16 --heads-kv 2)
  for m in "causal" "varlen-causal" "sliding-window --window 1024" "prefix-lm"; do
    for n in 1 "${counts[@]}"; do
      # shellcheck disable=SC2086  # $m is the mask and its options
      line=$(timeout 900 "${mpi[@]}" -np "$n" $cli run --device cuda --comm nccl --mask $m \
        --seqlen $((t * n)) "${heads[@]}" --head-dim 128 --layers 1 --timing 5 \
        2>> "$out/scaling.err" | tee -a "$out/scaling.log" | grep "weak scaling")
      echo "$m, $t tokens/GPU, $n GPUs: ${line:-FAILED (scaling.err)}" >> "$summary"
      [[ -n "$line" ]] || rc=1
    done
  done
done

# The peer: torch's ring on causal while the global tensors fit one GPU (q, k, v, their
# gradients and the repeated K/V heads: about 10 x T x 64 x 128 x 2 bytes).
for t in "${per_gpu[@]}"; do
  for n in "${counts[@]}"; do
    ((t * n <= 1048576)) || continue
    timeout 900 python3 -m torch.distributed.run --nproc-per-node "$n" bench/torch_cp_bench.py \
      --tokens-per-gpu "$t" --heads 64 --heads-kv 8 --head-dim 128 >> "$out/torch-cp.log" 2>&1 ||
      echo "torch context parallel, $t tokens/GPU, $n GPUs: FAILED (torch-cp.log)" >> "$summary"
  done
done
grep "\[result\]" "$out/torch-cp.log" >> "$summary" 2>/dev/null
cat "$summary"
((serialised == 0)) || rc=1
exit $rc
