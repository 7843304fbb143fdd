"""flexcp.attention against a float64 reference (DESIGN §6): the error, values and gradients, may
be at most twice that of a naive implementation in the same input precision plus a small atol.
Fresh random inputs, awkward lengths, random slice sets, fully masked rows, GQA, softcap, sink."""
import random

import pytest
import torch

import flexcp
from reference import attention as reference_attention, dense_mask, random_mask_slices

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
ATOL = {torch.float32: 1e-5, torch.bfloat16: 2e-3, torch.float16: 5e-4}


def inputs(seed, tq, tk, hq, hk, d, dtype, sink=False):
    g = torch.Generator().manual_seed(seed)
    q = (2 * torch.rand(tq, hq, d, generator=g) - 1).mul(2).to(dtype)
    k = (2 * torch.rand(tk, hk, d, generator=g) - 1).mul(2).to(dtype)
    v = (2 * torch.rand(tk, hk, d, generator=g) - 1).to(dtype)
    dout = (2 * torch.rand(tq, hq, d, generator=g) - 1).to(dtype)
    s = (2 * torch.rand(hq, generator=g)).float() if sink else None
    return q, k, v, dout, s


def check(mask, hq, hk, d, dtype, seed, scale=None, softcap=0.0, with_sink=False, device="cpu",
          deterministic=False):
    tq, tk = mask.seqlen_q, mask.seqlen_k
    q, k, v, dout, sink = inputs(seed, tq, tk, hq, hk, d, dtype, with_sink)
    dense = dense_mask(mask)
    # flexcp, with gradients.
    qg, kg, vg = (t.clone().to(device).requires_grad_() for t in (q, k, v))
    sg = sink.clone().to(device).requires_grad_() if sink is not None else None
    out, lse = flexcp.attention(qg, kg, vg, mask, scale=scale, softcap=softcap, sink=sg,
                                deterministic=deterministic)
    assert out.dtype == dtype and lse.dtype == torch.float32
    out.backward(dout.to(device))
    got = [t.cpu().double() for t in (out, qg.grad, kg.grad, vg.grad)]
    lse = lse.cpu()
    # The reference in float64, and the naive yardstick in float32 arithmetic on the same inputs,
    # its outputs rounded to the dtype.
    def run(dt, round_to):
        xs = [t.to(dt).requires_grad_() for t in (q, k, v)]
        s = sink.to(dt).requires_grad_() if sink is not None else None
        o, l = reference_attention(*xs, dense, scale, softcap, s)
        o.backward(dout.to(dt))
        res = [o, *(x.grad for x in xs)]
        res = [r.to(round_to).double() for r in res]
        return res, l.double(), (s.grad.double() if s is not None else None)
    ref, ref_lse, ref_dsink = run(torch.float64, torch.float64)
    naive, naive_lse, naive_dsink = run(torch.float32, dtype)
    for name, g, r, n in zip(("out", "dq", "dk", "dv"), got, ref, naive):
        assert not torch.isnan(g).any(), name
        err = (g - r).abs().max().item()
        naive_err = (n - r).abs().max().item()
        assert err <= 2 * naive_err + ATOL[dtype], f"{name}: {err} vs naive {naive_err}"
    # lse: finite where the reference is, -inf exactly where the row attends nothing.
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse.double()), finite)
    assert torch.all(lse.double()[~finite] == float("-inf"))
    if finite.any():
        lse_err = (lse.double()[finite] - ref_lse[finite]).abs().max().item()
        assert lse_err <= 2 * (naive_lse[finite] - ref_lse[finite]).abs().max().item() + 1e-4
    empty = ~dense.any(dim=1)
    assert torch.all(got[0][empty] == 0)
    if with_sink:
        err = (sg.grad.cpu().double() - ref_dsink).abs().max().item()
        assert err <= 2 * (naive_dsink - ref_dsink).abs().max().item() + 1e-3, "dsink"


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_standard_masks(dtype):
    dt = DTYPES[dtype]
    check(flexcp.masks.causal(113), 4, 2, 32, dt, 1)
    check(flexcp.masks.full(64, 239), 2, 1, 16, dt, 2)
    check(flexcp.masks.varlen_causal([30, 1, 70, 12]), 8, 2, 32, dt, 3)
    check(flexcp.masks.sliding_window([90, 50], 17), 4, 4, 16, dt, 4)
    check(flexcp.masks.sliding_window([90, 50], 17, symmetric=True), 4, 1, 16, dt, 5)
    check(flexcp.masks.block_causal([100, 37], 24), 2, 2, 32, dt, 6)
    check(flexcp.masks.prefix_lm([60, 40], [20, 0]), 2, 1, 16, dt, 7)
    check(flexcp.masks.shared_question(20, [30, 11]), 2, 2, 16, dt, 8)


def test_random_slice_sets_awkward_lengths_and_gqa():
    rng = random.Random(11)
    for i, (tq, tk) in enumerate([(1, 1), (1, 50), (113, 239), (239, 113), (70, 70)]):
        for hq, hk in [(1, 1), (2, 1), (8, 2), (6, 3)]:
            mask = flexcp.Mask(random_mask_slices(rng, tq, tk), tq, tk)
            check(mask, hq, hk, 16 if i % 2 else 32, [torch.float32, torch.bfloat16][i % 2],
                  100 + i)


def test_fully_masked_rows_and_empty_masks():
    holes = flexcp.Mask([(0, 10, 0, 20, "causal"), (40, 60, 5, 50, "full")], 60, 50)
    check(holes, 4, 2, 16, torch.float32, 21)
    check(flexcp.Mask([], 30, 20), 2, 1, 16, torch.bfloat16, 22)
    check(flexcp.masks.causal(40, 10), 2, 2, 16, torch.float32, 23)  # top rows see nothing


def test_softcap_sink_and_scale():
    check(flexcp.masks.causal(77), 4, 2, 32, torch.float32, 31, softcap=3.0)
    check(flexcp.masks.varlen_causal([40, 37]), 4, 1, 16, torch.float32, 32, with_sink=True)
    check(flexcp.masks.causal(50), 2, 1, 16, torch.bfloat16, 33, scale=-0.2, softcap=2.0,
          with_sink=True)


def test_results_are_repeatable():
    mask = flexcp.masks.varlen_causal([60, 80, 13])
    q, k, v, dout, _ = inputs(41, 153, 153, 8, 2, 32, torch.bfloat16)
    results = []
    for _ in range(2):
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        out, lse = flexcp.attention(qg, kg, vg, mask, deterministic=True)
        out.backward(dout)
        results.append([out, lse, qg.grad, kg.grad, vg.grad])
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_strided_inputs_are_read_in_place():
    mask = flexcp.masks.causal(50)
    q, k, v, _, _ = inputs(51, 50, 50, 4, 2, 16, torch.float32)
    wide = torch.zeros(50, 4, 32)
    wide[..., :16] = q
    strided = wide[..., :16]  # a view with a row stride of 128
    assert not strided.is_contiguous()
    a, _ = flexcp.attention(strided, k, v, mask)
    b, _ = flexcp.attention(q, k, v, mask)
    assert torch.equal(a, b)


def test_autocast_runs_in_the_autocast_dtype():
    mask = flexcp.masks.causal(40)
    q, k, v, _, _ = inputs(61, 40, 40, 2, 1, 16, torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, lse = flexcp.attention(q, k, v, mask)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    want, _ = flexcp.attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask)
    assert torch.equal(out, want)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available() or not flexcp.built_with_cuda(),
                                reason="needs a CUDA device and a build with the CUDA kernels")


@needs_cuda
@pytest.mark.parametrize("case", [
    dict(mask=("varlen_causal", [300, 1, 129, 200]), hq=8, hk=2, d=128, dtype=torch.bfloat16),
    dict(mask=("random", 113, 239), hq=4, hk=1, d=64, dtype=torch.float16, with_sink=True),
    dict(mask=("causal", 257), hq=2, hk=2, d=128, dtype=torch.bfloat16, softcap=5.0),
    dict(mask=("random", 1023, 300), hq=16, hk=2, d=64, dtype=torch.bfloat16, scale=0.3),
    dict(mask=("varlen_causal", [300, 1, 129, 200]), hq=8, hk=2, d=128, dtype=torch.bfloat16,
         deterministic=True),
    dict(mask=("random", 113, 239), hq=4, hk=1, d=64, dtype=torch.float16, with_sink=True,
         deterministic=True),
])
def test_cuda_values_and_gradients_match_the_reference(case):
    case = dict(case)
    kind, *args = case.pop("mask")
    if kind == "random":
        rng = random.Random(args[0] * 7 + args[1])
        mask = flexcp.Mask(random_mask_slices(rng, *args), *args)
    else:
        mask = getattr(flexcp.masks, kind)(*args)
    check(mask, seed=91, device="cuda", **case)


@needs_cuda
def test_cuda_deterministic_gradients_repeat_bit_for_bit():
    mask = flexcp.masks.varlen_causal([600, 800, 13, 700])
    q, k, v, dout, sink = inputs(42, 2113, 2113, 8, 2, 128, torch.bfloat16, sink=True)
    results = []
    for _ in range(2):
        qg, kg, vg, sg = (t.cuda().requires_grad_() for t in (q, k, v, sink))
        out, _ = flexcp.attention(qg, kg, vg, mask, sink=sg, deterministic=True)
        out.backward(dout.cuda())
        results.append([qg.grad, kg.grad, vg.grad, sg.grad])
    for a, b in zip(*results):
        assert torch.equal(a, b)


@needs_cuda
def test_cuda_forward_matches_the_reference():
    mask = flexcp.masks.varlen_causal([300, 1, 129, 200])
    q, k, v, _, sink = inputs(71, 630, 630, 8, 2, 128, torch.bfloat16, sink=True)
    for s in (None, sink):
        out, lse = flexcp.attention(q.cuda(), k.cuda(), v.cuda(), mask,
                                    sink=None if s is None else s.cuda())
        dense = dense_mask(mask)
        ref, _ = reference_attention(q.double(), k.double(), v.double(), dense, sink=s)
        naive, _ = reference_attention(q.float(), k.float(), v.float(), dense, sink=s)
        err = (out.cpu().double() - ref).abs().max().item()
        assert err <= 2 * (naive.bfloat16().double() - ref).abs().max().item() + 2e-3


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_gradients_of_any_layout_are_taken(device):
    # autograd hands the output's gradient over in the layout the code after the call made:
    # out.sum() gives an expanded scalar (strides 0), a transpose a permuted one. Each must give
    # the gradients of the same values in a dense layout.
    mask = flexcp.masks.varlen_causal([60, 1, 70])
    q, k, v, _, _ = inputs(31, 131, 131, 4, 2, 64, torch.bfloat16)
    q, k, v = (t.to(device) for t in (q, k, v))

    def grads(loss_of):
        xs = [t.clone().requires_grad_() for t in (q, k, v)]
        out, _ = flexcp.attention(*xs, mask, deterministic=True)  # dQ's bits repeat on CUDA too
        loss_of(out).backward()
        return [x.grad for x in xs]

    dense = torch.ones(131, 4, 64, dtype=torch.bfloat16, device=device)
    for got in (grads(lambda o: o.sum()), grads(lambda o: (o.transpose(0, 1) * 1.0).sum())):
        for g, w in zip(got, grads(lambda o: (o * dense).sum())):
            assert torch.equal(g, w)
