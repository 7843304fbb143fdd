"""One million tokens through the CUDA forward and backward: varlen causal, GQA 64:8, head dim 128,
bf16, documents of random lengths (1 to 64K, log-uniform) packed to 2^20 tokens. q alone is 2^33
elements, so every offset past 2^31 is exercised. Documents are independent, so the float64
reference (DESIGN §6) is computed document by document, in row chunks, on three of them: the
first, the longest and the last (its rows end at the last token), for two kv heads and their q
heads. Needs about 110 GiB of GPU memory; skipped elsewhere."""
import math
import random

import pytest
import torch

import flexcp

TOKENS = 1 << 20
HQ, HK, D = 64, 8, 128
GROUP = HQ // HK
KV_HEADS_CHECKED = (0, HK - 1)
ATOL = 2e-3  # bf16 (test_attention.py)
NEEDED_BYTES = 120 << 30


def _big_gpu():
    if not torch.cuda.is_available() or not flexcp.built_with_cuda():
        return False
    return torch.cuda.get_device_properties(0).total_memory >= NEEDED_BYTES


pytestmark = pytest.mark.skipif(not _big_gpu(), reason=(
    "needs a CUDA device with at least 120 GiB of memory and a build with the CUDA kernels"))


def document_lengths(seed):
    rng = random.Random(seed)
    lens = []
    while sum(lens) < TOKENS:
        n = int(math.exp(rng.uniform(0.0, math.log(1 << 16))))
        lens.append(min(n, TOKENS - sum(lens)))
    return lens


def chunked_causal_attention(q, k, v, dout, dt, naive, chunk=2048):
    """out, lse, dq, dk, dv of causal attention within one document, in `dt` arithmetic, for
    q, dout [L, G, D] (the G q heads of one kv head) and k, v [L, D], row chunk by row chunk.
    `naive` rounds to bf16 what a bf16 implementation feeds its matrix products (P, dS, and out
    before dO . out), the yardstick of DESIGN §6, as tests/test_util.h's naive backward does."""
    length, heads, dim = q.shape
    scale = 1.0 / math.sqrt(dim)
    q, k, v, dout = (t.to(dt) for t in (q, k, v, dout))
    rnd = (lambda t: t.to(torch.bfloat16).to(dt)) if naive else (lambda t: t)
    out = torch.empty(length, heads, dim, dtype=dt, device=q.device)
    lse = torch.empty(length, heads, dtype=dt, device=q.device)
    dq = torch.empty_like(out)
    dk = torch.zeros(length, dim, dtype=dt, device=q.device)
    dv = torch.zeros_like(dk)
    for h in range(heads):
        for r0 in range(0, length, chunk):
            r1 = min(length, r0 + chunk)
            qc, doc, kc, vc = q[r0:r1, h], dout[r0:r1, h], k[:r1], v[:r1]
            rows = torch.arange(r0, r1, device=q.device).unsqueeze(1)
            cols = torch.arange(r1, device=q.device).unsqueeze(0)
            s = (qc @ kc.T * scale).masked_fill_(cols > rows, float("-inf"))
            lse_c = torch.logsumexp(s, dim=-1)
            p = torch.exp(s - lse_c.unsqueeze(1))
            del s
            o = rnd(p) @ vc
            out[r0:r1, h], lse[r0:r1, h] = o, lse_c
            delta = (doc * rnd(o)).sum(-1)
            ds = p * (doc @ vc.T - delta.unsqueeze(1))
            dv[:r1] += rnd(p).T @ doc
            del p
            dq[r0:r1, h] = rnd(ds) @ kc * scale
            dk[:r1] += rnd(ds).T @ qc * scale
    return out, lse, dq, dk, dv


def test_million_token_varlen_causal_backward_matches_a_chunked_reference():
    lens = document_lengths(seed=2026)
    assert sum(lens) == TOKENS
    mask = flexcp.masks.varlen_causal(lens)
    g = torch.Generator(device="cuda").manual_seed(11)
    q = torch.randn(TOKENS, HQ, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(TOKENS, HK, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(TOKENS, HK, D, device="cuda", dtype=torch.bfloat16, generator=g)
    dout = torch.randn(TOKENS, HQ, D, device="cuda", dtype=torch.bfloat16, generator=g)
    q.requires_grad_()
    k.requires_grad_()
    v.requires_grad_()
    out, lse = flexcp.attention(q, k, v, mask)
    out.backward(dout)
    got_all = {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}
    for name, t in got_all.items():  # a sum, not isnan(t): no 8 GiB temporary
        assert torch.isfinite(t.sum(dtype=torch.float32)), f"{name} is not finite everywhere"
    assert torch.isfinite(lse).all()

    starts = [0]
    for n in lens[:-1]:
        starts.append(starts[-1] + n)
    longest = max(range(len(lens)), key=lambda i: lens[i])
    for d in sorted({0, longest, len(lens) - 1}):
        rows = slice(starts[d], starts[d] + lens[d])
        for kv in KV_HEADS_CHECKED:
            heads = slice(kv * GROUP, (kv + 1) * GROUP)
            args = (q.detach()[rows, heads], k.detach()[rows, kv], v.detach()[rows, kv],
                    dout[rows, heads])
            ref = chunked_causal_attention(*args, torch.float64, naive=False)
            naive = chunked_causal_attention(*args, torch.float32, naive=True)
            got = (out.detach()[rows, heads], lse[rows, heads], q.grad[rows, heads],
                   k.grad[rows, kv], v.grad[rows, kv])
            where = f"document {d} (tokens {rows.start}..{rows.stop}), kv head {kv}"
            for i, name in enumerate(("out", "lse", "dq", "dk", "dv")):
                r = ref[i]
                n = naive[i].double() if name == "lse" else naive[i].bfloat16().double()
                err = (got[i].double() - r).abs().max().item()
                naive_err = (n - r).abs().max().item()
                atol = 1e-4 if name == "lse" else ATOL
                assert err <= 2 * naive_err + atol, f"{where}: {name} {err} vs naive {naive_err}"
