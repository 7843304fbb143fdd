"""What the PyTorch front costs around the kernels, on the GPU host: flexcp.attention over a mask
(planned, and its workspace allocated, on every call), over a flexcp.AttentionPlan (planned once),
and the plan's training step (forward and backward) captured in a CUDA graph, each timed as
gpu_attention_bench.py times every peer (back-to-back calls between CUDA events, after a warm-up
that meets the power limit), with the host's own time per call (what the Python thread spends
issuing one, the GPU not waited for) beside it. Short sequences show the host's share; long ones
should be level. GQA 64:8, head dim 128, bf16. Then what a mask costs to make: flexcp's builder
and its plan beside flexcp.masks.from_mask_mod on the GPU, FlexAttention's create_block_mask
(eager and compiled) for the same document-causal mask_mod, and flexcp.masks.from_block_mask of
the compiled one's BlockMask (wall milliseconds, GPU drained).

    python3 bench/python_front_bench.py [--lengths 1024 4096 32768] [--out FILE]
    (flexcp importable: the package beside the CUDA build's module, as scripts/gpu-check.sh does)
"""
import argparse
import random
import statistics
import time

import torch

import flexcp
from gpu_attention_bench import time_ms

HEADS, HEADS_KV, HEAD_DIM = 64, 8, 128


def masks_of(t):
    rng = random.Random(t)
    docs = [rng.randint(64, max(65, t // 4)) for _ in range(4 * t // 64 + 8)]
    return {"causal": flexcp.masks.causal(t),
            "varlen-causal": flexcp.masks.varlen_causal(flexcp.masks.pack_lengths(docs, t, t // 4))}


def host_us(fn, calls=50):
    """Median host microseconds to issue one call (the GPU drained between batches)."""
    samples = []
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(samples)


def step_graph(plan, q, k, v, dout):
    """The plan's forward and backward captured once; returns the replay."""
    xs = [t.clone().requires_grad_() for t in (q, k, v)]

    def step():
        for x in xs:
            x.grad = None
        out, _ = flexcp.attention(*xs, plan)
        out.backward(dout)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def wall_ms(fn, repeat=3):
    """Median wall milliseconds of fn() as text, the GPU drained before and after ("oom" when it
    runs out of GPU memory: FlexAttention's eager create_block_mask holds the whole matrix)."""
    samples = []
    for _ in range(repeat):
        torch.cuda.synchronize()
        start = time.perf_counter()
        try:
            fn()
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            return "oom"
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) * 1e3)
    return f"{statistics.median(samples):.2f}"


def mask_building_lines(lengths):
    from torch.nn.attention.flex_attention import create_block_mask
    lines = ["| T | builder | + plan | from_mask_mod (cuda) | Flex create_block_mask | "
             "compiled | from_block_mask | slices: builder / from_mask_mod |",
             "|---|---|---|---|---|---|---|---|"]
    for t in lengths:
        rng = random.Random(t)
        lens = flexcp.masks.pack_lengths([rng.randint(64, max(65, t // 4)) for _ in range(64)],
                                         t, t // 4)
        doc = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens)).cuda()

        def document_causal(b, h, q, k):
            return (doc[q] == doc[k]) & (q >= k)

        built = flexcp.masks.varlen_causal(lens)
        found = flexcp.masks.from_mask_mod(document_causal, t, device="cuda")
        block_mask = create_block_mask(document_causal, None, None, t, t, device="cuda",
                                       _compile=True)
        assert flexcp.masks.from_block_mask(block_mask).slices == found.slices
        ms = [wall_ms(lambda: flexcp.masks.varlen_causal(lens)),
              wall_ms(lambda: flexcp.AttentionPlan(built, HEADS, HEADS_KV, HEAD_DIM,
                                                   device="cuda")),
              wall_ms(lambda: flexcp.masks.from_mask_mod(document_causal, t, device="cuda")),
              wall_ms(lambda: create_block_mask(document_causal, None, None, t, t,
                                                device="cuda")),
              wall_ms(lambda: create_block_mask(document_causal, None, None, t, t,
                                                device="cuda", _compile=True)),
              wall_ms(lambda: flexcp.masks.from_block_mask(block_mask))]
        lines.append(f"| {t} | " + " | ".join(ms) +
                     f" | {len(built.slices)} / {len(found.slices)} |")
        print(lines[-1], flush=True)
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 32768])
    p.add_argument("--out", help="also write the table here (Markdown)")
    a = p.parse_args()
    lines = ["| mask | T | mask fwd | plan fwd | mask fwd+bwd | plan fwd+bwd | graph fwd+bwd | "
             "mask / plan fwd+bwd | host us a call: mask / plan fwd |",
             "|---|---|---|---|---|---|---|---|---|"]
    for t in a.lengths:
        g = torch.Generator(device="cuda").manual_seed(t)
        make = lambda h: torch.randn(t, h, HEAD_DIM, device="cuda", dtype=torch.bfloat16,  # noqa: E731
                                     generator=g)
        q, k, v, dout = make(HEADS), make(HEADS_KV), make(HEADS_KV), make(HEADS)
        for name, mask in masks_of(t).items():
            plan = flexcp.AttentionPlan(mask, HEADS, HEADS_KV, HEAD_DIM, device="cuda")
            xs = [x.clone().requires_grad_() for x in (q, k, v)]

            def fwd(m):
                return lambda: flexcp.attention(q, k, v, m)

            def fwd_bwd(m):
                return lambda: torch.autograd.grad(flexcp.attention(*xs, m)[0], xs, dout)

            ms = {key: time_ms(fn)[0] for key, fn in (
                ("mask fwd", fwd(mask)), ("plan fwd", fwd(plan)),
                ("mask fwd+bwd", fwd_bwd(mask)), ("plan fwd+bwd", fwd_bwd(plan)),
                ("graph fwd+bwd", step_graph(plan, q, k, v, dout)))}
            host = (host_us(fwd(mask)), host_us(fwd(plan)))
            lines.append(f"| {name} | {t} | " + " | ".join(f"{ms[key]:.3f}" for key in ms) +
                         f" | {ms['mask fwd+bwd'] / ms['plan fwd+bwd']:.3f} | "
                         f"{host[0]:.0f} / {host[1]:.0f} |")
            print(lines[-1], flush=True)
            del plan
    lines += ["", "What a document-causal mask costs to make (wall milliseconds, medians of 3):", ""]
    lines += mask_building_lines(sorted(set(a.lengths) | {131072}))
    table = "\n".join(["(milliseconds per call, medians)", ""] + lines)
    print(table)
    if a.out:
        with open(a.out, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
