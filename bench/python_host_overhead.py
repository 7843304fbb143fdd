"""The PyTorch front's own cost per call, where the attention itself costs nothing: a tiny problem
(16 tokens, 2 q heads, 1 kv head, head dim 64), so that what is timed is Python, torch's
dispatcher and autograd, the hand-over of the tensors to the compiled module, and its checks.
Microseconds per call (median of 5 batches) of flexcp.attention's forward over a plan and over a
mask, forward+backward over a plan (torch.autograd.grad), and torch's
scaled_dot_product_attention at the same shape as the floor a framework call costs. Runs on the
CPU (the development machine) and, with --device cuda, on the GPU host (batches drained before
and after; at this size the host is what the GPU waits for).

    python3 bench/python_host_overhead.py [--device cpu|cuda] [--calls 2000]
"""
import argparse
import statistics
import time

import torch

import flexcp

TOKENS, HEADS_Q, HEADS_KV, HEAD_DIM = 16, 2, 1, 64


def us_per_call(fn, calls, device):
    samples = []
    for _ in range(5):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--calls", type=int, default=2000)
    a = p.parse_args()
    torch.set_num_threads(1)
    dtype = torch.float32 if a.device == "cpu" else torch.bfloat16
    g = torch.Generator().manual_seed(0)
    make = lambda h: torch.randn(TOKENS, h, HEAD_DIM, generator=g).to(a.device, dtype)  # noqa: E731
    q, k, v, dout = make(HEADS_Q), make(HEADS_KV), make(HEADS_KV), make(HEADS_Q)
    mask = flexcp.masks.causal(TOKENS)
    plan = flexcp.AttentionPlan(mask, HEADS_Q, HEADS_KV, HEAD_DIM, dtype=dtype, device=a.device)
    xs = [t.clone().requires_grad_() for t in (q, k, v)]
    # SDPA over [B, H, T, D] views of the same tensors, its kv head repeated for the q heads.
    group = HEADS_Q // HEADS_KV
    bhtd = lambda t, r=1: t.transpose(0, 1).repeat_interleave(r, 0)[None]  # noqa: E731

    def sdpa(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(
            bhtd(q), bhtd(k, group), bhtd(v, group), is_causal=True)

    dout_bhtd = bhtd(dout)
    cases = {
        "flexcp forward, plan": lambda: flexcp.attention(q, k, v, plan),
        "flexcp forward, mask": lambda: flexcp.attention(q, k, v, mask),
        "flexcp forward+backward, plan":
            lambda: torch.autograd.grad(flexcp.attention(*xs, plan)[0], xs, dout),
        "SDPA forward": lambda: sdpa(q, k, v),
        "SDPA forward+backward": lambda: torch.autograd.grad(sdpa(*xs), xs, dout_bhtd),
    }
    print(f"| call ({a.device}, {dtype}, torch {torch.__version__}) | us |")
    print("|---|---|")
    for name, fn in cases.items():
        for _ in range(100):  # warm-up: first-call paths, the allocator's pools
            fn()
        print(f"| {name} | {us_per_call(fn, a.calls, a.device):.1f} |", flush=True)


if __name__ == "__main__":
    main()
