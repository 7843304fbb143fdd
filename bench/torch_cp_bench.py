"""The weak-scaling peer of `flexcp run --timing`: torch's own context parallelism (the ring over
SDPA that `torch.distributed.tensor.experimental.context_parallel` substitutes for
scaled_dot_product_attention, its causal load balancing on) on a causal mask, one process per GPU:

    torchrun --nproc-per-node N bench/torch_cp_bench.py --tokens-per-gpu 65536 [--heads 64 ...]

Every rank makes the global q, k, v (the API shards them in place); K/V heads are repeated to the
q heads (the ring takes equal heads). Times the forward and the backward of one call, CUDA events
around back-to-back calls, the median of --repeat samples after a warm-up, on every rank; rank 0
prints the slowest rank's times, the per-GPU TFLOPS (the causal mask's attended pairs over the
ranks), and the single-GPU SDPA's TFLOPS on the per-GPU token count as the baseline rate:

    [result] ranks=N tokens_per_gpu=T dir=fwd time_ms=... tflops_per_gpu=... sdpa_1gpu_tflops=...
    efficiency=...
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F


def causal_flops(tokens, heads, head_dim):
    """Forward flops on the attended pairs of a causal mask (DESIGN §6: 4 x pairs x D x H)."""
    pairs = tokens * (tokens + 1) // 2
    return 4.0 * pairs * head_dim * heads


def median_ms(fn, repeat, calls=1):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start.record()
        for _ in range(calls):
            fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / calls)
    times.sort()
    return times[len(times) // 2]


def timed(q, k, v, repeat):
    """Forward and backward times (ms) of causal SDPA on q, k, v (leaf tensors with grad)."""
    dout = torch.randn_like(q)

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def bwd_only():  # a fresh graph each call: forward untimed, then the timed backward
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out.backward(dout)
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop)

    fwd_ms = median_ms(fwd, repeat)
    bwd_only()
    bwd = sorted(bwd_only() for _ in range(repeat))
    return fwd_ms, bwd[len(bwd) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens-per-gpu", type=int, default=65536)
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--heads-kv", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    mesh = init_device_mesh("cuda", (world,))
    tokens = a.tokens_per_gpu * world
    torch.manual_seed(0)  # the same global inputs on every rank
    shape = (1, a.heads, tokens, a.head_dim)
    q = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    group = a.heads // a.heads_kv
    kv_shape = (1, a.heads_kv, tokens, a.head_dim)
    k = torch.randn(kv_shape, device="cuda", dtype=torch.bfloat16).repeat_interleave(group, 1)
    v = torch.randn(kv_shape, device="cuda", dtype=torch.bfloat16).repeat_interleave(group, 1)
    with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
        for t in (q, k, v):
            t.requires_grad_(True)
        fwd_ms, bwd_ms = timed(q, k, v, a.repeat)
    slowest = torch.tensor([fwd_ms, bwd_ms], device="cuda")
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    fwd_ms, bwd_ms = slowest.tolist()

    # The single-GPU rate on the per-GPU token count (rank 0 alone, after the distributed run).
    baseline = None
    if rank == 0:
        t = a.tokens_per_gpu
        q1 = torch.randn((1, a.heads, t, a.head_dim), device="cuda", dtype=torch.bfloat16,
                         requires_grad=True)
        k1 = torch.randn_like(q1, requires_grad=True)
        v1 = torch.randn_like(q1, requires_grad=True)
        f1, b1 = timed(q1, k1, v1, a.repeat)
        flops1 = causal_flops(t, a.heads, a.head_dim)
        baseline = (flops1 / f1 / 1e9, 2.5 * flops1 / b1 / 1e9)
        flops = causal_flops(tokens, a.heads, a.head_dim) / world
        for direction, ms, f, base in (("fwd", fwd_ms, flops, baseline[0]),
                                       ("bwd", bwd_ms, 2.5 * flops, baseline[1])):
            tflops = f / ms / 1e9
            print(f"[result] peer=torch-context-parallel mask=causal ranks={world} "
                  f"tokens_per_gpu={a.tokens_per_gpu} heads={a.heads} heads_kv={a.heads_kv} "
                  f"head_dim={a.head_dim} dir={direction} time_ms={ms:.2f} "
                  f"tflops_per_gpu={tflops:.1f} sdpa_1gpu_tflops={base:.1f} "
                  f"efficiency={tflops / base:.3f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
