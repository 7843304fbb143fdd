"""The float64 torch reference the Python tests measure flexcp against (DESIGN §6), written here
from the mask definition (docs/masks.md), and random masks like the C++ tests' (test_util)."""
import math

import torch


def dense_mask(mask):
    """The attended pairs of a flexcp.Mask, from the slice definitions (bool [Tq, Tk])."""
    m = torch.zeros(mask.seqlen_q, mask.seqlen_k, dtype=torch.bool)
    for q0, q1, k0, k1, kind in mask.slices:
        sq, sk = q1 - q0, k1 - k0
        i = torch.arange(sq).unsqueeze(1)
        j = torch.arange(sk).unsqueeze(0)
        cond = {"full": torch.ones(sq, sk, dtype=torch.bool),
                "causal": j <= i + (sk - sq),
                "inv_causal": j >= i,
                "bi_causal": (j >= i) & (j <= i + (sk - sq))}[kind]
        assert not (m[q0:q1, k0:k1] & cond).any(), "a test mask covers a pair twice"
        m[q0:q1, k0:k1] |= cond
    return m


def document_ids(dense):
    """The document of each token by the definition (docs/api.md, Mask.document_ids): a new one
    starts at i when no attended pair (q, k) has min(q, k) < i <= max(q, k)."""
    q, k = dense.nonzero(as_tuple=True)
    low, high = torch.minimum(q, k), torch.maximum(q, k)
    ids = [0]
    for i in range(1, max(dense.shape)):
        ids.append(ids[-1] + int(not ((low < i) & (i <= high)).any()))
    return torch.tensor(ids[:max(dense.shape)], dtype=torch.int64)


def attention(q, k, v, dense, scale=None, softcap=0.0, sink=None):
    """out [Tq, Hq, D] and lse [Tq, Hq] by the definition, in q's dtype's arithmetic (float64 for
    the reference, float32 for the naive yardstick). Rows that attend nothing give 0 and -inf."""
    hq, hk, d = q.shape[1], k.shape[1], q.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    kr = k.repeat_interleave(hq // hk, dim=1)
    vr = v.repeat_interleave(hq // hk, dim=1)
    s = torch.einsum("qhd,khd->hqk", q, kr) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~dense.to(q.device), float("-inf"))
    if sink is not None:
        s = torch.cat([s, sink.to(s.dtype).view(hq, 1, 1).expand(hq, s.shape[1], 1)], dim=-1)
    lse = torch.logsumexp(s, dim=-1)  # [hq, tq]
    empty = ~dense.any(dim=1)  # [tq]
    p = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)
    if sink is not None:
        p = p[..., :-1]
    out = torch.einsum("hqk,khd->qhd", p, vr)
    lse = lse.T.masked_fill(empty.unsqueeze(1), float("-inf"))
    out = out.masked_fill(empty.view(-1, 1, 1), 0.0)
    return out, lse


def random_mask_slices(rng, seqlen_q, seqlen_k):
    """q and k cut into random segments, three cells of that grid in four carrying a random type."""
    def cuts(n):
        c = sorted({0, n, *(rng.randint(0, n) for _ in range(rng.randint(0, 4)))})
        return c
    qc, kc = cuts(seqlen_q), cuts(seqlen_k)
    slices = []
    for a, b in zip(qc, qc[1:]):
        for c, d in zip(kc, kc[1:]):
            if rng.random() < 0.75:
                slices.append((a, b, c, d, rng.choice(["full", "causal", "inv_causal", "bi_causal"])))
    rng.shuffle(slices)
    return slices
