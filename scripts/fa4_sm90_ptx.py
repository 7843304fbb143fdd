"""FlashAttention-4's sm90 kernels compiled on a machine without a GPU, for scripts/fa4-sass.sh:
each case runs FA4's own entry point (its own tile choice for the case) under torch's
FakeTensorMode, with the CuTe DSL told to target sm_90a and to keep the PTX it generates in the
folder given (read when the DSL loads: one case per process). Nothing is launched. bf16, head dim
128, GQA 64:8, one sequence of 4096 tokens.

    python scripts/fa4_sm90_ptx.py DUMP_DIR {bwd,fwd}-{causal,full}
"""
import os
import sys

if len(sys.argv) != 3:
    sys.exit("usage: fa4_sm90_ptx.py DUMP_DIR {bwd,fwd}-{causal,full}")

os.environ.setdefault("FLASH_ATTENTION_ARCH", "sm_90")  # FA4's kernel choice
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")  # the DSL's compilation target
os.environ.setdefault("FLASH_ATTENTION_NUM_SMS", "132")  # H100/H200
os.environ["CUTE_DSL_KEEP_PTX"] = "1"
os.environ["CUTE_DSL_DUMP_DIR"] = sys.argv[1]

import torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402


def compile_case(case):
    from flash_attn.cute import interface as fa4

    direction, mask = case.split("-")
    causal = mask == "causal"
    t, h, hk, d = 4096, 64, 8, 128
    with FakeTensorMode(allow_non_fake_inputs=True):
        make = lambda heads: torch.empty(1, t, heads, d, dtype=torch.bfloat16, device="cuda")
        q, k, v = make(h), make(hk), make(hk)
        if direction == "fwd":
            fa4._flash_attn_fwd(q, k, v, causal=causal)
        else:
            out, dout = make(h), make(h)
            lse = torch.empty(1, h, t, dtype=torch.float32, device="cuda")
            fa4._flash_attn_bwd(q, k, v, out, dout, lse, causal=causal)


def main():
    case = sys.argv[2]
    if case not in ("bwd-causal", "bwd-full", "fwd-causal", "fwd-full"):
        sys.exit(f"fa4_sm90_ptx: case '{case}', expected bwd-causal, bwd-full, fwd-causal or fwd-full")
    compile_case(case)


if __name__ == "__main__":
    main()
