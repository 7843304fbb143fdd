"""One FlashAttention-4 call inside a CUDA profiler range, for Nsight Compute beside flexcp's own
kernel on the same problem (scripts/gpu-profile.sh with FA4_SITE set; ncu --profile-from-start
off). bf16, head dim 128, one sequence of --seqlen tokens in FA4's (B, T, H, D) layout, full or
causal. Everything else (the DSL's compilation, a first call of each direction) runs before the
range, so the range holds only the kernels of one forward or one backward.

    python3 bench/fa4_profile_case.py --seqlen 32768 --heads 64 --heads-kv 8 --causal --backward
"""
import argparse

import torch
from flash_attn.cute import flash_attn_func


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seqlen", type=int, required=True)
    p.add_argument("--heads", type=int, default=64)
    p.add_argument("--heads-kv", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--backward", action="store_true", help="profile the backward, not the forward")
    a = p.parse_args()
    torch.manual_seed(0)
    shape = lambda h: (1, a.seqlen, h, a.head_dim)
    q = torch.randn(shape(a.heads), device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(shape(a.heads_kv), device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(2))
    dout = torch.randn(shape(a.heads), device="cuda", dtype=torch.bfloat16)

    def forward():
        out = flash_attn_func(q, k, v, causal=a.causal)
        return out[0] if isinstance(out, tuple) else out

    out = forward()
    torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)  # compiles the backward
    torch.cuda.synchronize()
    cudart = torch.cuda.cudart()
    cudart.cudaProfilerStart()
    if a.backward:
        torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    else:
        forward()
    torch.cuda.synchronize()
    cudart.cudaProfilerStop()


if __name__ == "__main__":
    main()
