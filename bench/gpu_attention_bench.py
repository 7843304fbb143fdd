"""flexcp's Hopper kernels and their peers on the DESIGN §6 kernel protocol, in one run on the GPU
host: `flexcp bench --device cuda` (every mask), torch SDPA (cuDNN and flash backends, on full and
causal) and compiled FlexAttention (every mask). The figure that matters is the ratio. With
--backward, the backward too (each peer's backward on its own forward's output, timed alone:
autograd.grad with the graph kept), counted as 2.5x the forward's flops.

Masks come from flexcp itself (`flexcp mask ... --out m.json`), so the peers compute exactly the
pairs flexcp does; TFLOPS count attended pairs only (forward 4 * area * D * Hq). Each row of these
masks attends at most two key intervals, which is what the FlexAttention mask_mod encodes.

    python3 bench/gpu_attention_bench.py --flexcp CLI --specs DIR --out DIR
        (DIR holds <mask>-<T>.json files; bench/gpu_bench.sh writes them)
"""
import argparse
import glob
import json
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention


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
    area = int((hi - lo).sum())
    return lo, hi, area


def tflops(area, d, hq, ms):
    return 4.0 * area * d * hq / (ms * 1e-3) / 1e12


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


BWD_RATIO = 2.5  # backward flops / forward flops


def flexcp_ms(cli, spec_path, a):
    """Median milliseconds of flexcp per direction ("fwd", "bwd", "fwd+bwd"), timed by the tool
    with CUDA events."""
    cmd = [cli, "bench", "--device", "cuda", "--mask-file", spec_path, "--heads", str(a.heads),
           "--heads-kv", str(a.heads_kv), "--head-dim", str(a.head_dim), "--dtype", "bf16",
           "--json", "--warmup", "2", "--repeat", "7"] + (["--backward"] if a.backward else [])
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(" ".join(cmd) + " failed: " + (res.stderr or res.stdout)[-400:])
    return {r["direction"]: r["time_us"] * 1e-3
            for r in json.loads(res.stdout.strip().splitlines()[-1])}


def bench_backward(fn, q, k, v):
    """Median milliseconds of the backward of fn(q, k, v) alone."""
    xs = [x.detach().requires_grad_() for x in (q, k, v)]
    out = fn(*xs)
    dout = torch.randn_like(out)
    return bench(lambda: torch.autograd.grad(out, xs, dout, retain_graph=True))


def ratio(r, a, b):
    return "%.2f" % (r[a] / r[b]) if a in r and b in r else "-"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--flexcp", required=True, help="the flexcp tool")
    p.add_argument("--specs", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--heads", type=int, default=64)
    p.add_argument("--heads-kv", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--backward", action="store_true", help="time the backward too")
    a = p.parse_args()
    torch.manual_seed(0)
    dev = "cuda"
    flex = torch.compile(flex_attention, dynamic=False)
    rows = []
    for path in sorted(glob.glob(os.path.join(a.specs, "*.json"))):
        name = os.path.basename(path)[:-5]
        spec = json.load(open(path))
        t = spec["seqlen_q"]
        lo, hi, area = row_intervals(spec)
        lo_t = torch.tensor(lo, dtype=torch.int32, device=dev)
        hi_t = torch.tensor(hi, dtype=torch.int32, device=dev)

        def mask_mod(b, h, q, kv):
            return ((kv >= lo_t[0, q]) & (kv < hi_t[0, q])) | ((kv >= lo_t[1, q]) & (kv < hi_t[1, q]))

        shape_q, shape_kv = (1, a.heads, t, a.head_dim), (1, a.heads_kv, t, a.head_dim)
        q = torch.randn(shape_q, device=dev, dtype=torch.bfloat16)
        k = torch.randn(shape_kv, device=dev, dtype=torch.bfloat16)
        v = torch.randn(shape_kv, device=dev, dtype=torch.bfloat16)
        # Past 32K the eager block mask would materialise T x T booleans (128 GiB at 128K);
        # compiled, it is built block by block.
        block_mask = create_block_mask(mask_mod, 1, 1, t, t, device=dev, _compile=t > 32768)
        row = {"mask": name, "seqlen": t, "area": area}
        times = flexcp_ms(a.flexcp, path, a)
        row["flexcp_ms"] = times["fwd"]
        out_flex = flex(q, k, v, block_mask=block_mask, enable_gqa=True)
        row["flex_ms"] = bench(lambda: flex(q, k, v, block_mask=block_mask, enable_gqa=True))
        if a.backward:
            row["flexcp_bwd_ms"] = times["bwd"]
            row["flex_bwd_ms"] = bench_backward(
                lambda *x: flex(*x, block_mask=block_mask, enable_gqa=True), q, k, v)
        kind = spec["slices"][0]["type"] if len(spec["slices"]) == 1 else None
        if kind in ("full", "causal") and spec["slices"][0]["q"] == [0, t] and spec["slices"][0]["k"] == [0, t]:
            rep = a.heads // a.heads_kv
            ke, ve = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            for backend, label in ((SDPBackend.CUDNN_ATTENTION, "cudnn"), (SDPBackend.FLASH_ATTENTION, "flash")):
                try:
                    with sdpa_kernel([backend]):
                        ref = F.scaled_dot_product_attention(q, ke, ve, is_causal=kind == "causal")
                        row[label + "_ms"] = bench(lambda: F.scaled_dot_product_attention(q, ke, ve, is_causal=kind == "causal"))
                        if a.backward:
                            row[label + "_bwd_ms"] = bench_backward(
                                lambda *x: F.scaled_dot_product_attention(*x, is_causal=kind == "causal"),
                                q, ke, ve)
                    # The mask_mod encodes the same pairs: FlexAttention agrees with SDPA.
                    row[label + "_vs_flex"] = float((ref.float() - out_flex.float()).abs().max())
                except Exception as e:  # a backend that cannot run this shape
                    row[label + "_error"] = f"{type(e).__name__}: {e}".splitlines()[0][:120]
        for key in [k_ for k_ in list(row) if k_.endswith("_ms")]:
            mul = BWD_RATIO if key.endswith("_bwd_ms") else 1.0
            row[key.replace("_ms", "_tflops")] = mul * tflops(area, a.head_dim, a.heads, row[key])
        print("[case] mask=%s T=%d H=%d HK=%d D=%d [result] %s" % (
            name, t, a.heads, a.heads_kv, a.head_dim,
            " ".join(f"{k_}={row[k_]:.1f}" for k_ in row if k_.endswith("_tflops"))), flush=True)
        rows.append(row)
    os.makedirs(a.out, exist_ok=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "heads": a.heads, "heads_kv": a.heads_kv, "head_dim": a.head_dim, "dtype": "bf16"}
    tag = f"h{a.heads}-{a.heads_kv}-d{a.head_dim}"
    json.dump({"meta": meta, "rows": rows}, open(os.path.join(a.out, f"gpu_bench_{tag}.json"), "w"), indent=1)
    with open(os.path.join(a.out, f"gpu_bench_{tag}.md"), "w") as md:
        md.write(f"# flexcp forward and peers ({meta['gpu']}, torch {meta['torch']}, bf16, H={a.heads} HK={a.heads_kv} D={a.head_dim})\n\n")
        md.write("| mask | T | area | flexcp TFLOPS | cuDNN | flash | FlexAttention | flexcp/cuDNN | flexcp/flash | flexcp/Flex |\n"
                 "|---|---|---|---|---|---|---|---|---|---|\n")
        for r in sorted(rows, key=lambda r: (r["mask"].rsplit("-", 1)[0], r["seqlen"])):
            md.write("| %s | %d | %d | %.1f | %s | %s | %.1f | %s | %s | %s |\n" % (
                r["mask"].rsplit("-", 1)[0], r["seqlen"], r["area"], r["flexcp_tflops"],
                "%.1f" % r["cudnn_tflops"] if "cudnn_tflops" in r else "-",
                "%.1f" % r["flash_tflops"] if "flash_tflops" in r else "-",
                r["flex_tflops"], ratio(r, "flexcp_tflops", "cudnn_tflops"),
                ratio(r, "flexcp_tflops", "flash_tflops"), ratio(r, "flexcp_tflops", "flex_tflops")))
    if not a.backward:
        return 0
    with open(os.path.join(a.out, f"gpu_bench_bwd_{tag}.md"), "w") as md:
        md.write(f"# flexcp backward and peers ({meta['gpu']}, torch {meta['torch']}, bf16, H={a.heads} HK={a.heads_kv} D={a.head_dim}; 2.5x forward flops)\n\n")
        md.write("| mask | T | flexcp bwd TFLOPS | cuDNN | flash | FlexAttention | flexcp/cuDNN | flexcp/flash | flexcp/Flex |\n"
                 "|---|---|---|---|---|---|---|---|---|\n")
        fmt = lambda r, key: "%.1f" % r[key] if key in r else "-"
        for r in sorted(rows, key=lambda r: (r["mask"].rsplit("-", 1)[0], r["seqlen"])):
            md.write("| %s | %d | %s | %s | %s | %s | %s | %s | %s |\n" % (
                r["mask"].rsplit("-", 1)[0], r["seqlen"], fmt(r, "flexcp_bwd_tflops"),
                fmt(r, "cudnn_bwd_tflops"), fmt(r, "flash_bwd_tflops"), fmt(r, "flex_bwd_tflops"),
                ratio(r, "flexcp_bwd_tflops", "cudnn_bwd_tflops"),
                ratio(r, "flexcp_bwd_tflops", "flash_bwd_tflops"),
                ratio(r, "flexcp_bwd_tflops", "flex_bwd_tflops")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
