"""What it costs to find a mask's slices from its pairs (flexcp.masks.from_mask_mod, from_dense
and from_block_mask), on the CPU (the development machine) or a GPU: a document-causal mask of
documents of 64 to T/4 tokens, given as a FlexAttention mask_mod, as its boolean matrix (up to
16K tokens) and as FlexAttention's create_block_mask of the same mask_mod; each result is
checked against flexcp's own builder. Wall milliseconds, median of 3.

    python3 bench/mask_from_pairs_bench.py [--device cpu|cuda] [--lengths 4096 16384 32768]
"""
import argparse
import random
import statistics
import time

import torch

import flexcp


def wall_ms(fn, device):
    samples = []
    for _ in range(3):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = fn()
        if device == "cuda":
            torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples), result


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 32768])
    a = p.parse_args()
    if a.device == "cpu":
        torch.set_num_threads(2)
    try:
        from torch.nn.attention.flex_attention import create_block_mask
    except ImportError:  # torch < 2.5
        create_block_mask = None
    print(f"| T ({a.device}, torch {torch.__version__}) | from_mask_mod | from_dense | "
          "from_block_mask |")
    print("|---|---|---|---|")
    for t in a.lengths:
        rng = random.Random(t)
        lens = flexcp.masks.pack_lengths([rng.randint(64, max(65, t // 4)) for _ in range(64)],
                                         t, t // 4)
        doc = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens)).to(a.device)

        def document_causal(b, h, q, k):
            return (doc[q] == doc[k]) & (q >= k)

        expected = flexcp.masks.varlen_causal(lens).slices
        cells = []
        ms, m = wall_ms(lambda: flexcp.masks.from_mask_mod(document_causal, t, device=a.device),
                        a.device)
        assert m.slices == expected
        cells.append(f"{ms:.1f}")
        if t <= 16384:  # the matrix itself: T^2 bytes
            pos = torch.arange(t, device=a.device)
            dense = document_causal(0, 0, pos.unsqueeze(1), pos.unsqueeze(0))
            ms, m = wall_ms(lambda: flexcp.masks.from_dense(dense), a.device)
            assert m.slices == expected
            cells.append(f"{ms:.1f}")
            del dense
        else:
            cells.append("-")
        if create_block_mask is not None:
            # Compiled on the GPU: the eager one holds int64 temporaries of the whole matrix
            # (out of memory at 128K); eager on the CPU, where compiling needs a C++ toolchain.
            block_mask = create_block_mask(document_causal, None, None, t, t, device=a.device,
                                           _compile=a.device == "cuda")
            ms, m = wall_ms(lambda: flexcp.masks.from_block_mask(block_mask), a.device)
            assert m.slices == expected
            cells.append(f"{ms:.1f}")
        else:
            cells.append("-")
        print(f"| {t} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
