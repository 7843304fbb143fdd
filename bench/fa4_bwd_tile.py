"""What FlashAttention-4's sm90 backward gains from its 80-row q blocks: its own backward timed
with the q-block rows it picks (80 on full masks, 64 on causal ones at head dim 128) and with the
other choice forced, in one run. flexcp's backward runs 64-row q blocks on every mask; this says
what the larger block is worth in the kernel that uses it before flexcp builds one
(h200-backward-2026-12-04.md section 8, lever (a)).

    python3 bench/fa4_bwd_tile.py [--seqlen 32768] [--heads 64] [--heads-kv 8] [--rounds 3]

bf16, head dim 128, one sequence in FA4's (B, T, H, D) layout, GQA as given. FA4 comes from
FA4_SITE (scripts/gpu-fa4.sh) on PYTHONPATH. The tile is forced by replacing the interface's
`_tile_size_bwd_sm90` (FA4 4.0.0b36) with one that returns the same configuration but the rows;
the rows are part of FA4's compile key, so each choice compiles its own kernel. Rounds alternate
the choices; each round times `--repeat` backwards back to back with CUDA events. Prints one
table row a case: TFLOPS (2.5x the forward's flops, halved for causal) a round, their median
and the ratio of 80 rows to 64.
"""
import argparse
import dataclasses
import statistics

import torch
import flash_attn.cute.interface as fa4_interface
from flash_attn.cute import flash_attn_func

_PICK = fa4_interface._tile_size_bwd_sm90


def force_rows(rows):
    """FA4's backward configuration with `rows` q rows a block (None: its own choice)."""
    def pick(*args, **kwargs):
        cfg = _PICK(*args, **kwargs)
        if rows is None:
            return cfg
        # A q block that is not a multiple of 64 rows computes dQ transposed (FA4's own rule).
        return dataclasses.replace(cfg, m_block_size=rows, dQ_swapAB=rows % 64 != 0)
    fa4_interface._tile_size_bwd_sm90 = pick


def time_backward(q, k, v, dout, causal, rows, repeat):
    force_rows(rows)
    out = flash_attn_func(q, k, v, causal=causal)
    out = out[0] if isinstance(out, tuple) else out
    for _ in range(2):  # compiles this choice's kernel, then warms it
        torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeat):
        torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeat / 1e3  # seconds a backward


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seqlen", type=int, default=32768)
    p.add_argument("--heads", type=int, default=64)
    p.add_argument("--heads-kv", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeat", type=int, default=10)
    a = p.parse_args()
    torch.manual_seed(0)
    d = 128
    shape = lambda h: (1, a.seqlen, h, d)
    q = torch.randn(shape(a.heads), device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(shape(a.heads_kv), device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(2))
    dout = torch.randn(shape(a.heads), device="cuda", dtype=torch.bfloat16)
    print(f"FA4 backward, seqlen {a.seqlen}, heads {a.heads}:{a.heads_kv}, hd {d}, bf16; "
          f"TFLOPS a round (rounds alternate the rows)")
    print("| mask | rows | rounds | median | 80 / 64 |")
    print("|---|---|---|---|---|")
    for causal in (False, True):
        flops = 2.5 * 4 * a.seqlen * a.seqlen * a.heads * d * (0.5 if causal else 1.0)
        rates = {64: [], 80: []}
        for _ in range(a.rounds):
            for rows in rates:
                rates[rows].append(flops / time_backward(q, k, v, dout, causal, rows, a.repeat) / 1e12)
        med = {rows: statistics.median(r) for rows, r in rates.items()}
        for rows, r in rates.items():
            ratio = f"{med[80] / med[64]:.3f}" if rows == 80 else ""
            print(f"| {'causal' if causal else 'full'} | {rows} | "
                  f"{', '.join(f'{x:.1f}' for x in r)} | {med[rows]:.1f} | {ratio} |")
    force_rows(None)


if __name__ == "__main__":
    main()
