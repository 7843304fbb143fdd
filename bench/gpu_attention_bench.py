"""flexcp's Hopper kernels and their peers on the DESIGN §6 kernel protocol, in one run on the GPU
host: `flexcp bench --device cuda` (every mask), torch SDPA (cuDNN and flash backends, on full and
causal), compiled FlexAttention (every mask; its FLASH backend too where FlashAttention-4 is
installed) and FlashAttention-4 (`flash_attn.cute`, on every mask it can express: full, causal,
and documents with full, causal or sliding-window attention inside each). The figure that matters
is the ratio. With --backward, the backward and fwd+bwd too (each peer's backward on its own
forward's output), counted as 2.5x and 3.5x the forward's flops.

Masks come from flexcp itself (`flexcp mask ... --out m.json`), so the peers compute exactly the
pairs flexcp does; TFLOPS count attended pairs only (forward 4 * area * D * Hq). Each row of these
masks attends at most two key intervals, which is what the FlexAttention mask_mod encodes; an
FA4 parameterisation is used only where it reproduces every row's interval exactly.

Every peer is timed as flexcp's tool times itself: samples of back-to-back calls between CUDA
events (no cache flush between them), so that host launch cost counts the same for all, as many
samples of the same length as the tool takes; the median.
Long runs meet the board's power limit, so the SM clock and power are sampled while each is timed
(`gpu_clocks.py`) and written beside the TFLOPS (a second table): a peer ahead per cycle may be
behind per joule. flexcp's tool runs in its own process and prints when each direction's timed
runs ran, so its figures are the samples of those runs, as a peer's are of its own.

    python3 bench/gpu_attention_bench.py --flexcp CLI --specs DIR --out DIR
        (DIR holds <mask>-<T>.json files; bench/gpu_bench.sh writes them)
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F
from gpu_clocks import ClockSampler
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

try:  # FlashAttention-4 (bench/README.md says how to install it on the GPU host)
    from flash_attn.cute import flash_attn_func, flash_attn_varlen_func
except ImportError:
    flash_attn_func = flash_attn_varlen_func = None

FLOP_RATIO = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}  # per direction, over the forward's flops


def row_intervals(spec):
    """Per q row, up to two attended key intervals [lo, hi), and the exact area."""
    t = spec["seqlen_q"]
    lo = np.zeros((2, t), np.int64)
    hi = np.zeros((2, t), np.int64)
    used = np.zeros(t, np.int64)
    for s in spec["slices"]:
        (qb, qe), (kb, ke), kind = s["q"], s["k"], s["type"]
        sq, sk = qe - qb, ke - kb
        i = np.arange(sq)
        begin = kb + (i if kind in ("inv_causal", "bi_causal") else np.zeros_like(i))
        end = np.full(sq, ke) if kind in ("full", "inv_causal") else kb + i + (sk - sq) + 1
        begin, end = np.maximum(begin, kb), np.minimum(end, ke)
        keep = end > begin
        rows = np.arange(qb, qe)[keep]
        slot = used[rows]
        if (slot > 1).any():
            raise ValueError("a row attends more than two key intervals")
        lo[slot, rows], hi[slot, rows] = begin[keep], end[keep]
        used[rows] += 1
    # Order the two intervals and join touching ones.
    swap = (used == 2) & (lo[1] < lo[0])
    lo[:, swap], hi[:, swap] = lo[::-1, swap], hi[::-1, swap]
    join = (used == 2) & (hi[0] == lo[1])
    hi[0, join], lo[1, join], hi[1, join] = hi[1, join], 0, 0
    return lo, hi, int((hi - lo).sum())


def fa4_form(lo, hi):
    """The FlashAttention-4 call that computes exactly these pairs, or None: documents (the rows
    that attend from themselves on, or a run of rows sharing one interval) with full, causal or
    sliding-window (window_size=(left, 0)) attention inside each."""
    t = lo.shape[1]
    if hi[1].any() or not (hi[0] > lo[0]).all():
        return None  # two intervals in a row, or a row attending nothing
    rows = np.arange(t)
    if (hi[0] == rows + 1).all():  # causal family: a document starts where a row attends itself
        starts = rows[lo[0] == rows]
        doc_start = starts[np.searchsorted(starts, rows, side="right") - 1]
        left = int((rows - lo[0]).max())
        expect = np.maximum(doc_start, rows - left)
        doc_len = np.diff(np.append(starts, t))
        window = None if left + 1 >= doc_len.max() else (left, 0)
        form = {"causal": window is None, "window_size": window or (None, None)}
    else:  # full documents: runs of rows with the same interval, covering exactly themselves
        starts = rows[np.append(True, (lo[0][1:] != lo[0][:-1]) | (hi[0][1:] != hi[0][:-1]))]
        doc_start = starts[np.searchsorted(starts, rows, side="right") - 1]
        expect = doc_start
        ends = np.append(starts[1:], t)
        if not (hi[0] == ends[np.searchsorted(starts, rows, side="right") - 1]).all():
            return None
        form = {"causal": False, "window_size": (None, None)}
    if not (lo[0] == expect).all():
        return None
    form["cu_seqlens"] = np.append(starts, t).astype(np.int32)
    return form


# The sampling rule of flexcp's tool (tools/flexcp/device_tensor.cc), for every peer: WARMUP untimed
# calls, one timed call that sizes a sample (back-to-back calls filling about 20 ms), samples
# untimed for WARMUP_MS more, then SAMPLES samples and their median. The GPU then meets its power
# limit before the timed samples and stays there, as in training, whichever peer runs after an
# idle gap (a shorter run of flexcp's than of its peers measured it at boost clock while they were
# held at the limit: bench/results/h200-peers-2026-12-04.md).
WARMUP, WARMUP_MS, SAMPLES, SAMPLE_MS = 3, 500, 35, 20.0


def time_ms(fn):
    """(median milliseconds per call of fn, the SM clock and power while it was sampled)."""
    def batch_ms(calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    for _ in range(WARMUP):
        fn()
    calls = min(max(int(SAMPLE_MS / max(batch_ms(1), 1e-3)), 1), 200)
    warmed = 0.0
    while warmed < WARMUP_MS:
        warmed += batch_ms(calls)
    with ClockSampler() as clocks:
        per_call = [batch_ms(calls) / calls for _ in range(SAMPLES)]
    return statistics.median(per_call), clocks.summary()


def time_directions(fn, inputs, backward):
    """({"fwd": ms, "bwd": ms, "fwd+bwd": ms}, the same keys: clocks) of out = fn(*inputs) (the
    backward on its own forward's output, the graph kept)."""
    timed = {"fwd": time_ms(lambda: fn(*inputs))}
    if backward:
        xs = [x.detach().requires_grad_() for x in inputs]
        out = fn(*xs)
        dout = torch.randn_like(out)
        timed["bwd"] = time_ms(lambda: torch.autograd.grad(out, xs, dout, retain_graph=True))
        timed["fwd+bwd"] = time_ms(lambda: torch.autograd.grad(fn(*xs), xs, dout))
    return {d: t[0] for d, t in timed.items()}, {d: t[1] for d, t in timed.items()}


def flexcp_ms(cli, spec_path, a):
    """(milliseconds, clocks) of flexcp per direction, timed by the tool with CUDA events: the
    forward in a run of its own; with --backward, the backward and fwd+bwd from a second run.
    Each direction's clocks are those of its timed runs (the window the tool prints)."""
    ms, clocks = {}, {}
    for backward in [False] + ([True] if a.backward else []):
        cmd = [cli, "bench", "--device", "cuda", "--mask-file", spec_path, "--heads", str(a.heads),
               "--heads-kv", str(a.heads_kv), "--head-dim", str(a.head_dim), "--dtype", "bf16",
               "--json", "--warmup", str(WARMUP), "--warmup-ms", str(WARMUP_MS),
               "--repeat", str(SAMPLES)]
        cmd += ["--backward"] if backward else []
        with ClockSampler() as sampler:
            res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(" ".join(cmd) + " failed: " + (res.stderr or res.stdout)[-400:])
        for r in json.loads(res.stdout.strip().splitlines()[-1]):
            if backward == (r["direction"] != "fwd"):
                ms[r["direction"]] = r["time_us"] * 1e-3
                # Over the direction's own timed runs, as the peers' (a tool from before the
                # windows: the busy samples of its whole run).
                clocks[r["direction"]] = (sampler.summary(window=r["window_s"]) if "window_s" in r
                                          else sampler.summary(busy_only=True))
    return ms, clocks


def fa4_peer(form, q, k, v):
    """(fn, inputs, to_common) for FA4, which takes (B, T, H, D) (and (T, H, D) for documents):
    its inputs are copied into its own layout once, outside the timing."""
    opts = {"causal": form["causal"], "window_size": form["window_size"]}
    cu = torch.tensor(form["cu_seqlens"], device="cuda")
    longest = int(np.diff(form["cu_seqlens"]).max())
    first = lambda r: r[0] if isinstance(r, tuple) else r
    if len(cu) == 2:
        inputs = tuple(x.transpose(1, 2).contiguous() for x in (q, k, v))
        return (lambda q_, k_, v_: first(flash_attn_func(q_, k_, v_, **opts)), inputs,
                lambda o: o.transpose(1, 2))
    inputs = tuple(x[0].transpose(0, 1).contiguous() for x in (q, k, v))
    fn = lambda q_, k_, v_: first(flash_attn_varlen_func(
        q_, k_, v_, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest, max_seqlen_k=longest,
        **opts))
    return fn, inputs, lambda o: o.transpose(0, 1)[None]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--flexcp", required=True, help="the flexcp tool")
    p.add_argument("--specs", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--heads", type=int, default=64)
    p.add_argument("--heads-kv", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--backward", action="store_true", help="time the backward and fwd+bwd too")
    a = p.parse_args()
    torch.manual_seed(0)
    dev = "cuda"
    flex = torch.compile(flex_attention, dynamic=False)
    directions = ["fwd"] + (["bwd", "fwd+bwd"] if a.backward else [])
    peers_seen = []
    rows = []
    os.makedirs(a.out, exist_ok=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "sms": torch.cuda.get_device_properties(0).multi_processor_count,
            "heads": a.heads, "heads_kv": a.heads_kv, "head_dim": a.head_dim, "dtype": "bf16",
            "fa4": flash_attn_func is not None}
    tag = f"h{a.heads}-{a.heads_kv}-d{a.head_dim}"

    # Written again after every case, so that a run cut short by a call's time limit keeps the
    # tables and clocks of the cases it finished.
    def save(rows):
        with open(os.path.join(a.out, f"gpu_bench_{tag}.json"), "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
        for d in directions:
            write_table(os.path.join(a.out, f"gpu_bench_{d.replace('+', '')}_{tag}.md"), d, meta,
                        rows, peers_seen)
        write_clocks(os.path.join(a.out, f"gpu_bench_clocks_{tag}.md"), directions, meta, rows,
                     ["flexcp"] + peers_seen)

    for path in sorted(glob.glob(os.path.join(a.specs, "*.json"))):
        name = os.path.basename(path)[:-5]
        spec = json.load(open(path))
        t = spec["seqlen_q"]
        lo, hi, area = row_intervals(spec)
        # One 1-D tensor per bound: FlexAttention's FLASH backend traces the mask_mod with the CuTe
        # DSL, which indexes captured tensors by the q index only.
        lo0, lo1, hi0, hi1 = (torch.tensor(x, dtype=torch.int32, device=dev)
                              for x in (lo[0], lo[1], hi[0], hi[1]))

        def mask_mod(b, h, q, kv):
            return ((kv >= lo0[q]) & (kv < hi0[q])) | ((kv >= lo1[q]) & (kv < hi1[q]))

        shape_q, shape_kv = (1, a.heads, t, a.head_dim), (1, a.heads_kv, t, a.head_dim)
        q = torch.randn(shape_q, device=dev, dtype=torch.bfloat16)
        k = torch.randn(shape_kv, device=dev, dtype=torch.bfloat16)
        v = torch.randn(shape_kv, device=dev, dtype=torch.bfloat16)
        # Past 32K the eager block mask would materialise T x T booleans (128 GiB at 128K);
        # compiled, it is built block by block.
        block_mask = create_block_mask(mask_mod, 1, 1, t, t, device=dev, _compile=t > 32768)
        row = {"mask": name, "seqlen": t, "area": area, "ms": {}, "clocks": {}, "errors": {},
               "max_diff": {}}
        row["ms"]["flexcp"], row["clocks"]["flexcp"] = flexcp_ms(a.flexcp, path, a)

        def flex_with(options):
            return lambda q_, k_, v_: flex(q_, k_, v_, block_mask=block_mask, enable_gqa=True,
                                           kernel_options=options)
        same = lambda o: o
        # (peer, fn, inputs, to_common): out = fn(*inputs), to_common(out) as (1, Hq, T, D).
        peers = [("flex", flex_with(None), (q, k, v), same)]
        if flash_attn_func is not None:
            peers.append(("flex-flash", flex_with({"BACKEND": "FLASH"}), (q, k, v), same))
            form = fa4_form(lo, hi)
            if form is not None:
                peers.append(("fa4", *fa4_peer(form, q, k, v)))
        kind = spec["slices"][0]["type"] if len(spec["slices"]) == 1 else None
        if kind in ("full", "causal") and spec["slices"][0]["q"] == [0, t] and spec["slices"][0]["k"] == [0, t]:
            rep = a.heads // a.heads_kv
            ke, ve = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            for backend, label in ((SDPBackend.CUDNN_ATTENTION, "cudnn"), (SDPBackend.FLASH_ATTENTION, "flash")):
                def sdpa(q_, k_, v_, backend=backend):
                    with sdpa_kernel([backend]):
                        return F.scaled_dot_product_attention(q_, k_, v_, is_causal=kind == "causal")
                peers.append((label, sdpa, (q, ke, ve), same))
        reference = None  # the first peer's output: the others must agree with it
        for label, fn, inputs, to_common in peers:
            try:
                out = to_common(fn(*inputs))
                if reference is None:
                    reference = out
                row["max_diff"][label] = float((out.float() - reference.float()).abs().max())
                row["ms"][label], row["clocks"][label] = time_directions(fn, inputs, a.backward)
            except Exception as e:  # a peer that cannot run this shape
                row["errors"][label] = f"{type(e).__name__}: {e}".splitlines()[0][:160]
            if label not in peers_seen:
                peers_seen.append(label)
        row["tflops"] = {
            who: {d: FLOP_RATIO[d] * 4.0 * area * a.head_dim * a.heads / (ms[d] * 1e-3) / 1e12
                  for d in ms} for who, ms in row["ms"].items()}
        print("[case] mask=%s T=%d H=%d HK=%d D=%d [result] %s%s" % (
            name, t, a.heads, a.heads_kv, a.head_dim,
            " ".join(f"{who}.{d}={v_:.1f}" for who, per in row["tflops"].items()
                     for d, v_ in per.items()),
            "".join(f" [error] {who}: {e}" for who, e in row["errors"].items())), flush=True)
        rows.append(row)
        save(rows)
    return 0


def write_table(path, direction, meta, rows, peers):
    """One Markdown table per direction: TFLOPS of flexcp and every peer, and flexcp's ratios."""
    fmt = lambda r, who: "%.1f" % r["tflops"][who][direction] if direction in r["tflops"].get(who, {}) else "-"
    ratio = lambda r, who: ("%.2f" % (r["tflops"]["flexcp"][direction] / r["tflops"][who][direction])
                            if direction in r["tflops"].get(who, {}) else "-")
    with open(path, "w") as md:
        md.write(f"# flexcp {direction} and peers ({meta['gpu']}, torch {meta['torch']}, bf16, "
                 f"H={meta['heads']} HK={meta['heads_kv']} D={meta['head_dim']}; TFLOPS at "
                 f"{FLOP_RATIO[direction]}x the forward's flops)\n\n")
        md.write("| mask | T | flexcp | " + " | ".join(peers) + " | " +
                 " | ".join(f"/{who}" for who in peers) + " |\n")
        md.write("|---" * (3 + 2 * len(peers)) + "|\n")
        for r in sorted(rows, key=lambda r: (r["mask"].rsplit("-", 1)[0], r["seqlen"])):
            md.write("| %s | %d | %s | %s | %s |\n" % (
                r["mask"].rsplit("-", 1)[0], r["seqlen"], fmt(r, "flexcp"),
                " | ".join(fmt(r, who) for who in peers), " | ".join(ratio(r, who) for who in peers)))
        errors = [(r["mask"], who, e) for r in rows for who, e in r["errors"].items()]
        if errors:
            md.write("\nPeers that could not run: " +
                     "; ".join(f"{m} {who} ({e})" for m, who, e in errors) + "\n")


def write_clocks(path, directions, meta, rows, peers):
    """The SM clock (MHz), board power (W) and the share of samples a limit held the clock, while
    each peer was timed, per direction."""
    def cell(r, who, d):
        c = r["clocks"].get(who, {}).get(d, {})
        return "%.0f / %.0f / %.0f%%" % (c["mhz"], c["watts"], 100 * c["limited"]) if c else "-"
    with open(path, "w") as md:
        md.write(f"# SM clock (MHz) / board power (W) / share of samples held by a power or "
                 f"thermal limit, while timed ({meta['gpu']}, bf16, "
                 f"H={meta['heads']} HK={meta['heads_kv']} D={meta['head_dim']}; each over "
                 "its timed samples; power instantaneous where the driver reads it)\n\n")
        cols = [(who, d) for d in directions for who in peers]
        write_cells(md, cols, rows, cell)
        write_per_cycle(md, cols, meta, rows)


def write_cells(md, cols, rows, cell):
    """A table of one cell(row, who, direction) per (who, direction) column, a row per case."""
    md.write("| mask | T | " + " | ".join(f"{who} {d}" for who, d in cols) + " |\n")
    md.write("|---" * (2 + len(cols)) + "|\n")
    for r in sorted(rows, key=lambda r: (r["mask"].rsplit("-", 1)[0], r["seqlen"])):
        md.write("| %s | %d | %s |\n" % (r["mask"].rsplit("-", 1)[0], r["seqlen"],
                                          " | ".join(cell(r, who, d) for who, d in cols)))


# Dense bf16/fp16 tensor-core flops per SM and cycle on sm_90 (989 TFLOPS at 1830 MHz, 132 SMs).
TENSOR_FLOPS_PER_SM_CYCLE = 4096


def write_per_cycle(md, cols, meta, rows):
    """What each peer does per cycle and spends per flop: at the power limit, a kernel that needs
    fewer cycles is clocked down, so TFLOPS alone hide which one does more per cycle (the share of
    the tensor pipe's peak in its cycles) and which one uses less energy per flop (board watts
    over TFLOPS, pJ per flop)."""
    def cell(r, who, d):
        c = r["clocks"].get(who, {}).get(d, {})
        t = r["tflops"].get(who, {}).get(d)
        if not c or not t or not c["mhz"]:
            return "-"
        share = t * 1e12 / (c["mhz"] * 1e6 * meta["sms"] * TENSOR_FLOPS_PER_SM_CYCLE)
        return "%.3f / %.2f" % (share, c["watts"] / t)
    md.write("\n## Share of the tensor pipe's peak per cycle / pJ per flop (board power over "
             f"TFLOPS; {meta['sms']} SMs x {TENSOR_FLOPS_PER_SM_CYCLE} flops a cycle)\n\n")
    write_cells(md, cols, rows, cell)


if __name__ == "__main__":
    sys.exit(main())
