"""Times torch's CPU scaled_dot_product_attention, the peer of flexcp's CPU kernel (DESIGN §6).

Prints one line: "fwd_us=<median> bwd_us=<median> torch=<version>" (bwd_us: forward plus backward
minus forward, only with --backward), or "unavailable: <why>".
Called by bench/cpu_attention_bench with the same shapes it times.
"""
import argparse
import statistics
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seqlen", type=int, required=True)
    p.add_argument("--heads", type=int, required=True)
    p.add_argument("--heads-kv", type=int, required=True)
    p.add_argument("--head-dim", type=int, required=True)
    p.add_argument("--dtype", choices=["fp32", "bf16"], required=True)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--backward", action="store_true", help="time the backward too")
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # torch missing or unusable here
        print(f"unavailable: {type(e).__name__}: {e}".splitlines()[0])
        return 0
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    g = torch.Generator().manual_seed(0)

    def make(h):
        t = torch.rand(1, h, a.seqlen, a.head_dim, generator=g) * 2 - 1
        return t.to(dtype).requires_grad_(a.backward)

    q, k, v = make(a.heads), make(a.heads_kv), make(a.heads_kv)
    gqa = a.heads != a.heads_kv

    def forward():
        return F.scaled_dot_product_attention(q, k, v, is_causal=a.causal, enable_gqa=gqa)

    def forward_backward():
        out = forward()
        out.backward(torch.ones_like(out))

    def median_us(fn):
        fn()
        times = []
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e6

    with torch.no_grad():
        fwd = median_us(forward)
    line = f"fwd_us={fwd:.1f}"
    if a.backward:
        line += f" bwd_us={median_us(forward_backward) - fwd:.1f}"
    print(f"{line} torch={torch.__version__} threads={torch.get_num_threads()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
