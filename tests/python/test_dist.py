"""flexcp.DistAttention over torch.distributed (gloo), real processes on 1, 2, 3 and 4 ranks:
results and gradients equal the single-process ones, for layers sharing one object with their
backwards in any order; roll equals torch.roll on the global tensor; dispatch and undispatch round
trips are bit-exact; a rank with another mask is stopped before data moves. On CUDA tensors (GPU
hosts): over an NCCL group (one rank per GPU) and over gloo with the staged backend (ranks sharing
the GPU), against one GPU's flexcp.attention."""
import datetime
import os
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import flexcp
from reference import dense_mask, document_ids

HQ, HK, D = 4, 2, 16


def problem():
    mask = flexcp.masks.varlen_causal([90, 200, 3, 160, 60])  # 513 tokens: awkward everywhere
    return mask, mask.seqlen_q


def layer_inputs(seed, t, dtype, d=D, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    q = (2 * torch.rand(t, HQ, d, generator=g) - 1).mul(2).to(dtype)
    k = (2 * torch.rand(t, HK, d, generator=g) - 1).mul(2).to(dtype)
    v = (2 * torch.rand(t, HK, d, generator=g) - 1).to(dtype)
    dout = (2 * torch.rand(t, HQ, d, generator=g) - 1).to(dtype)
    sink = torch.rand(HQ, generator=g) * 2
    return tuple(x.to(device) for x in (q, k, v, dout, sink))


def check_layers(attn, mask, t, dtype, backward_order, with_sink, d=D, device="cpu"):
    layers = []
    for i in range(len(backward_order)):
        q, k, v, dout, sink = layer_inputs(100 + i, t, dtype, d, device)
        # One process's result, autograd included.
        qs, ks, vs = (x.clone().requires_grad_() for x in (q, k, v))
        ss = sink.clone().requires_grad_() if with_sink else None
        out, lse = flexcp.attention(qs, ks, vs, mask, sink=ss, softcap=5.0)
        out.backward(dout)
        want = [out.detach(), lse, qs.grad, ks.grad, vs.grad, ss.grad if with_sink else None]
        # Distributed: this rank's rows as leaves.
        ql = attn.dispatch(q).requires_grad_()
        kl = attn.dispatch_kv(k).requires_grad_()
        vl = attn.dispatch_kv(v).requires_grad_()
        sl = sink.clone().requires_grad_() if with_sink else None
        o, l = attn(ql, kl, vl, softcap=5.0, sink=sl)
        layers.append((want, (ql, kl, vl, sl), o, l, attn.dispatch(dout)))
    for i in backward_order:
        _, _, o, _, dout_local = layers[i]
        o.backward(dout_local)
    ulp = {torch.float32: 1e-5, torch.bfloat16: 1 / 256}[dtype]
    for want, (ql, kl, vl, sl), o, l, _ in layers:
        got_out = attn.undispatch(o.detach())
        got = [got_out, attn.undispatch(l), attn.undispatch(ql.grad), attn.undispatch(kl.grad),
               attn.undispatch(vl.grad)]
        for name, g, w in zip(("out", "lse", "dq", "dk", "dv"), got, want):
            finite = torch.isfinite(w.double())
            assert torch.equal(torch.isfinite(g.double()), finite), name
            err = (g.double()[finite] - w.double()[finite]).abs().max().item()
            scale = max(1.0, w.double()[finite].abs().max().item())
            assert err <= 4 * ulp * scale, f"{name}: {err}"
        if with_sink:
            # Each rank's sink gradient is the sum over all ranks (as for a replicated parameter).
            # It sums dO . O over the rows, O rounded to the dtype by each run (stages merge in
            # another order than one call): in bf16 a relative 2e-3, as the C++ device tests.
            tol = 1e-4 if dtype == torch.float32 or o.device.type == "cpu" else 2e-3
            assert torch.allclose(sl.grad, want[5], rtol=tol, atol=tol), (sl.grad, want[5])


def check_stats(mask, t, dtype, d=D, device="cpu"):
    """keep_stats: the last call's bytes and stage times, forward then backward; the bytes agree
    over the ranks (what one sends another receives) and the backward returns an fp32 dK and dV
    row for every K and V row received. Without keep_stats, last_stats is refused."""
    with pytest.raises(ValueError, match="keep_stats=False"):
        flexcp.DistAttention(mask, HQ, HK, d).last_stats()
    attn = flexcp.DistAttention(mask, HQ, HK, d, keep_stats=True)
    assert attn.last_stats() is None
    q, k, v, dout, _ = layer_inputs(7, t, dtype, d, device)
    ql, kl, vl = (x.requires_grad_() for x in (attn.dispatch(q), attn.dispatch_kv(k),
                                               attn.dispatch_kv(v)))
    out, _ = attn(ql, kl, vl)
    fwd = attn.last_stats()
    assert len(fwd["forward_stages_ms"]) >= 1
    assert all(w >= 0 and c >= 0 for w, c in fwd["forward_stages_ms"]), fwd
    assert fwd["forward_ms"] > 0 and fwd["backward_ms"] == 0, fwd
    out.backward(attn.dispatch(dout))
    s = attn.last_stats()
    assert s["backward_ms"] > 0 and len(s["backward_stages_ms"]) == len(s["forward_stages_ms"]), s
    assert all(w >= 0 and c >= 0 for w, c in s["backward_stages_ms"]), s
    assert s["bwd_bytes_sent"] == s["fwd_bytes_received"] * 4 // q.element_size(), s
    totals = torch.tensor([s["fwd_bytes_sent"], s["fwd_bytes_received"], s["bwd_bytes_sent"],
                           s["bwd_bytes_received"]], dtype=torch.float64)
    dist.all_reduce(totals, group=attn._host_group)  # gloo (CPU tensors), the ranks of attn
    assert totals[0] == totals[1] and totals[2] == totals[3], totals
    if attn.world_size == 1:
        assert totals.sum() == 0, totals


def check_roll(attn, t):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(t, 3, 2, generator=g)
    local = attn.dispatch(x)
    chunk = t // (attn.world_size * 8)
    docs = document_ids(dense_mask(attn.mask))
    for shift in (0, 1, -1, chunk, -chunk, t + 7, -3 * t - 2):
        y = attn.undispatch(attn.roll(local, shift))
        assert torch.equal(y, torch.roll(x, shift, 0)), shift
        within = attn.undispatch(attn.roll(local, shift, within_documents=True, fill=-100))
        pos = torch.arange(t)
        src = pos - shift
        keep = (src >= 0) & (src < t)
        keep &= docs[src.clamp(0, t - 1)] == docs[pos]
        want = torch.full_like(x, -100)
        want[keep] = x[src[keep]]
        assert torch.equal(within, want), shift
    # The gradient rolls back.
    leaf = local.clone().requires_grad_()
    w = torch.randn(leaf.shape, generator=g)
    (attn.roll(leaf, 3) * w).sum().backward()
    assert torch.equal(attn.undispatch(leaf.grad),
                       torch.roll(attn.undispatch(w), -3, 0))


def check_replan(attn, mask, t, dtype=torch.float32, d=D, device="cpu"):
    """The next batch's mask (another length, other documents) over the same communicators; the
    first object keeps working beside it."""
    mask2 = flexcp.masks.varlen_causal([41, 300, 7, 150])
    attn2 = attn.replan(mask2)
    assert attn2._comms is attn._comms and (attn2.mask, attn.mask) == (mask2, mask)
    assert int(attn2.position_ids.max()) < mask2.seqlen_q < mask.seqlen_q
    check_layers(attn2, mask2, mask2.seqlen_q, dtype, [1, 0], with_sink=True, d=d, device=device)
    check_layers(attn, mask, t, dtype, [0], with_sink=False, d=d, device=device)
    with pytest.raises(ValueError, match="replan: mask must be a flexcp.Mask, got str"):
        attn.replan("causal")


def check_calls_return_after_gloo_lets_go():
    """flexcp's gloo calls return only once gloo's worker thread dropped the call's tensors (under
    torch 2.15 a worker doing so at interpreter exit aborts the process): the tensor's reference
    counts are back where they were. A bare all_reduce returns before that in about a third of
    the calls here."""
    t = torch.ones(64)
    before = (t._use_count(), sys.getrefcount(t))
    for i in range(50):
        flexcp._dist._collective(dist.all_reduce, t, group=None)
        assert (t._use_count(), sys.getrefcount(t)) == before, i


def test_a_tensor_gloo_never_lets_go_of_is_named_after_the_time_out(monkeypatch):
    monkeypatch.setenv("FLEXCP_COMM_TIMEOUT_S", "0.05")
    t = torch.ones(3)
    with pytest.raises(RuntimeError, match="gloo still holds the tensors of a completed call "
                       "after 0.05 s"):
        flexcp._dist._until_gloo_lets_go([t], [(0, 0)])


def worker(rank, world, init_file):
    # The time-out turns a stuck collective into an error instead of a hang.
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    try:
        mask, t = problem()
        attn = flexcp.DistAttention(mask, HQ, HK, D)
        # Round trips, bit-exact.
        x = torch.randn(t, HQ, D, generator=torch.Generator().manual_seed(3)).bfloat16()
        assert torch.equal(attn.undispatch(attn.dispatch(x)), x)
        assert attn.position_ids.shape[0] == attn.dispatch(x).shape[0]
        check_layers(attn, mask, t, torch.float32, [0], with_sink=False)
        check_layers(attn, mask, t, torch.float32, [1, 0], with_sink=True)
        check_layers(attn, mask, t, torch.bfloat16, [0, 2, 1], with_sink=False)
        check_stats(mask, t, torch.float32)
        check_roll(attn, t)
        check_replan(attn, mask, t)
        check_calls_return_after_gloo_lets_go()
        # Bad input is named, on every rank alike.
        lq, lk = attn.position_ids.shape[0], attn.kv_token_ids.shape[0]
        with pytest.raises(ValueError, match="q has shape"):
            attn(torch.zeros(lq + 1, HQ, D), torch.zeros(lk, HK, D), torch.zeros(lk, HK, D))
        with pytest.raises(ValueError, match="k has dtype bf16, expected fp32"):
            attn(torch.zeros(lq, HQ, D), torch.zeros(lk, HK, D).bfloat16(),
                 torch.zeros(lk, HK, D))
        with pytest.raises(ValueError, match="dtype torch.int16, expected float32, "
                                             "bfloat16 or float16"):
            attn(torch.zeros(lq, HQ, D, dtype=torch.int16), torch.zeros(lk, HK, D),
                 torch.zeros(lk, HK, D))
        qkv = torch.zeros(lq, HQ, D), torch.zeros(lk, HK, D), torch.zeros(lk, HK, D)
        with pytest.raises(ValueError, match="flexcp.DistAttention: scale is 0, expected a "
                                             "nonzero number"):
            attn(*qkv, scale=0.0)
        with pytest.raises(ValueError, match="softcap must be a real number, got str"):
            attn(*qkv, softcap="1")
        # Sizes that are not integers are named before anything is planned (not truncated).
        with pytest.raises(ValueError, match="flexcp.DistAttention: heads_q is 4.5, expected an "
                                             "integer"):
            flexcp.DistAttention(mask, 4.5, HK, D)
        with pytest.raises(ValueError, match="roll: shift is 1.5, expected an integer"):
            attn.roll(torch.zeros(lq), 1.5)
        # A host group that is not the group's ranks is named before anything is planned.
        if world > 1:
            lone = dist.new_group([0], backend="gloo")  # collective: every rank makes it
            with pytest.raises(ValueError, match="host_group has 1 ranks" if rank == 0 else
                               "this rank is not in host_group"):
                flexcp.DistAttention(mask, HQ, HK, D, host_group=lone)
        # A rank with another mask: every rank is told before any data moves.
        other = flexcp.masks.causal(t) if rank == world - 1 and world > 1 else mask
        if world > 1:
            with pytest.raises(RuntimeError, match="differ from rank 0's"):
                flexcp.DistAttention(other, HQ, HK, D)
            with pytest.raises(RuntimeError, match="differ from rank 0's"):
                attn.replan(other)
    finally:
        # Right after a collective (the mismatched plan's check), as in user code: under torch
        # 2.4 this deadlocked on gloo's worker thread until flexcp's collectives waited for it to
        # let go of their tensors (python/flexcp/_dist.py, _collective).
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_dist_attention_over_gloo(world, tmp_path):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(worker, args=(world, str(tmp_path / "init")), nprocs=world, join=True)


def cuda_worker(rank, world, backend, init_file):
    torch.cuda.set_device(0)  # one GPU: NCCL with one rank, or staged ranks sharing it
    os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    try:
        mask, t = problem()
        attn = flexcp.DistAttention(mask, HQ, HK, 64)
        g = torch.Generator().manual_seed(3)  # the same global tensor on every rank
        x = torch.randn(t, HQ, 64, generator=g).bfloat16().cuda()
        assert torch.equal(attn.undispatch(attn.dispatch(x)), x)
        # The sm90 kernels (bf16, head dim 64): two layers, backwards in reverse order.
        check_layers(attn, mask, t, torch.bfloat16, [1, 0], with_sink=True, d=64, device="cuda")
        check_stats(mask, t, torch.bfloat16, d=64, device="cuda")
        check_replan(attn, mask, t, torch.bfloat16, d=64, device="cuda")
        y = torch.randn(t, 3, generator=g).cuda()
        assert torch.equal(attn.undispatch(attn.roll(attn.dispatch(y), 5)), torch.roll(y, 5, 0))
        lq, lk = attn.position_ids.shape[0], attn.kv_token_ids.shape[0]
        with pytest.raises(ValueError, match="k is on cpu, expected cuda:0"):
            z = torch.zeros(lq, HQ, 64, device="cuda").bfloat16()
            attn(z, torch.zeros(lk, HK, 64).bfloat16(), torch.zeros(lk, HK, 64).bfloat16())
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("backend,world", [("nccl", 1), ("gloo", 1), ("gloo", 2)])
def test_dist_attention_on_cuda_tensors(backend, world, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the CUDA DistAttention runs on the GPU host")
    if not flexcp._flexcp.built_with_cuda():
        pytest.skip("flexcp was built without CUDA kernels")
    if backend == "nccl" and world > torch.cuda.device_count():
        pytest.skip(f"NCCL needs {world} GPUs")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(cuda_worker, args=(world, backend, str(tmp_path / "init")), nprocs=world, join=True)
