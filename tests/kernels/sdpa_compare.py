"""flexcp's forward and backward against torch SDPA (DESIGN §6), on the device given: `flexcp
attn` runs on saved tensors; torch computes the same masks (from flexcp's own JSON spec) as a
dense mask. The rule: flexcp's error against a float64 reference at most twice torch SDPA's own
error in the same input precision, plus a small atol. Rows that attend nothing: flexcp gives 0
and -inf. Gradients: dout is zero on those rows (where SDPA's softmax has no keys), and SDPA gets
an additive mask of -1e4, so that its gradients there are zero as flexcp's are.

    python3 sdpa_compare.py --cli FLEXCP --device cpu|cuda --work DIR
Exit 77 (skipped) when torch, numpy or the device is missing.
"""
import argparse
import json
import os
import subprocess
import sys
import zlib

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print(f"SKIP: {e}")
    sys.exit(77)


def dense_mask(spec):
    """The attended pairs of a flexcp mask spec, by the slice definitions of DESIGN §2."""
    m = torch.zeros(spec["seqlen_q"], spec["seqlen_k"], dtype=torch.bool)
    for s in spec["slices"]:
        (qb, qe), (kb, ke), kind = s["q"], s["k"], s["type"]
        sq, sk = qe - qb, ke - kb
        i = torch.arange(sq).unsqueeze(1)
        j = torch.arange(sk).unsqueeze(0)
        cond = {
            "full": torch.ones(sq, sk, dtype=torch.bool),
            "causal": j <= i + (sk - sq),
            "inv_causal": j >= i,
            "bi_causal": (j >= i) & (j <= i + (sk - sq)),
        }[kind]
        m[qb:qe, kb:ke] |= cond
    return m


def run_case(a, name, mask_args, tq, hq, hk, d, dtype):
    work = a.work
    spec_path = os.path.join(work, f"{name}.json")
    if isinstance(mask_args, dict):  # a spec written here
        json.dump(mask_args, open(spec_path, "w"))
    else:  # a generator of the flexcp tool
        subprocess.run([a.cli, "mask", *mask_args, "--out", spec_path], check=True,
                       stdout=subprocess.DEVNULL)
    spec = json.load(open(spec_path))
    tk = spec["seqlen_k"]
    # crc32, not hash(): Python salts str hashes per process, and a failure must be repeatable.
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    tdtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    # Inputs rounded to the kernel's dtype first: both sides read the same values.
    q = (2 * torch.rand(tq, hq, d, generator=gen) - 1).to(tdtype)
    k = (2 * torch.rand(tk, hk, d, generator=gen) - 1).to(tdtype)
    v = (2 * torch.rand(tk, hk, d, generator=gen) - 1).to(tdtype)
    mask = dense_mask(spec)
    rows = mask.any(dim=1)
    dout = ((2 * torch.rand(tq, hq, d, generator=gen) - 1) * rows[:, None, None]).to(tdtype)
    names = ("q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv")
    paths = {n: os.path.join(work, f"{name}-{n}.npy") for n in names}
    for n, t in (("q", q), ("k", k), ("v", v), ("dout", dout)):
        np.save(paths[n], t.float().numpy())
    subprocess.run([a.cli, "attn", "--mask-file", spec_path, "--device", a.device, "--dtype", dtype,
                    *(x for n in names for x in (f"--{n}", paths[n]))], check=True)
    out, lse, dq, dk, dv = (torch.from_numpy(np.load(paths[n])).double()
                            for n in ("out", "lse", "dq", "dk", "dv"))
    dev = a.device

    def sdpa(x_q, x_k, x_v):
        # [T, H, D] -> [1, H, T, D]; GQA by expanding K/V heads.
        rep = hq // hk
        qq = x_q.permute(1, 0, 2).unsqueeze(0).to(dev)
        kk = x_k.repeat_interleave(rep, dim=1).permute(1, 0, 2).unsqueeze(0).to(dev)
        vv = x_v.repeat_interleave(rep, dim=1).permute(1, 0, 2).unsqueeze(0).to(dev)
        o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask.to(dev))
        return o.squeeze(0).permute(1, 0, 2).double().cpu()

    def sdpa_grads(x_q, x_k, x_v, x_do):
        leaves = [x.to(dev).requires_grad_() for x in (x_q, x_k, x_v)]
        rep = hq // hk
        qq = leaves[0].permute(1, 0, 2).unsqueeze(0)
        kk = leaves[1].repeat_interleave(rep, dim=1).permute(1, 0, 2).unsqueeze(0)
        vv = leaves[2].repeat_interleave(rep, dim=1).permute(1, 0, 2).unsqueeze(0)
        additive = torch.zeros(mask.shape, dtype=x_q.dtype).masked_fill(~mask, -1e4).to(dev)
        o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=additive)
        o.backward(x_do.permute(1, 0, 2).unsqueeze(0).to(dev))
        return [x.grad.double().cpu() for x in leaves]

    grad_ok = True
    ref_g = sdpa_grads(q.double(), k.double(), v.double(), dout.double())
    low_g = sdpa_grads(q, k, v, dout)
    grad_errs = []
    for g, r, lo in zip((dq, dk, dv), ref_g, low_g):
        e, te = (g - r).abs().max().item(), (lo - r).abs().max().item()
        grad_ok = grad_ok and e <= 2 * te + 2e-3 and not torch.isnan(g).any()
        grad_errs.append(f"{e:.2e}/{te:.2e}")

    ref = sdpa(q.double(), k.double(), v.double())
    torch_low = sdpa(q, k, v)  # torch's own kernel in the input precision
    err = (out[rows] - ref[rows]).abs().max().item()
    torch_err = (torch_low[rows] - ref[rows]).abs().max().item()
    ok = err <= 2 * torch_err + 2e-4 and not torch.isnan(out).any()
    # lse from float64 scores; rows that attend nothing must give exactly 0 and -inf.
    scale = 1.0 / d ** 0.5
    kr = k.double().repeat_interleave(hq // hk, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.double(), kr) * scale
    ref_lse = torch.logsumexp(s.masked_fill(~mask, float("-inf")), dim=-1).T
    lse_err = (lse[rows] - ref_lse[rows]).abs().max().item()
    ok = ok and lse_err <= 1e-3
    empty_ok = bool((out[~rows] == 0).all() and torch.isneginf(lse[~rows]).all())
    ok = ok and empty_ok and grad_ok
    print(f"{'ok  ' if ok else 'FAIL'} {name}: Tq={tq} Tk={tk} H={hq}/{hk} D={d} {dtype} "
          f"max|out-ref|={err:.2e} (torch SDPA {dtype}: {torch_err:.2e}) max|lse-ref|={lse_err:.2e} "
          f"empty rows {int((~rows).sum())} {'ok' if empty_ok else 'WRONG'}; "
          f"max|grad-ref| (flexcp/torch) dq {grad_errs[0]} dk {grad_errs[1]} dv {grad_errs[2]}",
          flush=True)
    return ok


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cli", required=True)
    p.add_argument("--device", choices=("cpu", "cuda"), required=True)
    p.add_argument("--work", required=True)
    a = p.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        print("SKIP: no CUDA device visible to torch")
        return 77
    os.makedirs(a.work, exist_ok=True)
    # Awkward document lengths (a one-token document too); generators cycle through them.
    doc_lens = os.path.join(a.work, "doclens.txt")
    with open(doc_lens, "w") as f:
        f.write("\n".join(str(n) for n in (300, 1, 129, 200, 147, 513, 77, 64, 255)) + "\n")
    docs = ["--doc-lens", doc_lens]
    cases = [
        ("causal", ["--mask", "causal", "--seqlen", "1000"], 1000, 8, 2, 128, "bf16"),
        ("full", ["--mask", "full", "--seqlen", "513"], 513, 4, 4, 64, "fp16"),
        ("varlen-causal", ["--mask", "varlen-causal", "--seqlen", "1500", *docs], 1500, 8, 1, 128, "bf16"),
        ("sliding-window", ["--mask", "sliding-window", "--window", "200", "--seqlen", "900", *docs],
         900, 6, 2, 128, "bf16"),
        ("block-causal", ["--mask", "block-causal", "--block", "128", "--seqlen", "700", *docs],
         700, 4, 2, 64, "bf16"),
        ("shared-question", ["--mask", "shared-question", "--question", "100", "--seqlen", "777", *docs],
         777, 2, 1, 128, "fp16"),
        # Rows 40..189 and keys past 320 attended by nobody; a cross-attention shape.
        ("holes", {"version": 1, "seqlen_q": 330, "seqlen_k": 350, "slices": [
            {"q": [0, 40], "k": [0, 60], "type": "causal"},
            {"q": [190, 330], "k": [10, 320], "type": "full"}]}, 330, 4, 1, 128, "bf16"),
    ]
    results = [run_case(a, *c) for c in cases]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
