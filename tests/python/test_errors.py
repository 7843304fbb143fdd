"""Bad input raises ValueError naming the argument (C++ messages carried through); outputs of a
failed call are not half-written; what a user passed is left alone."""
import pytest
import torch

import flexcp


def make(tq=8, tk=10, hq=4, hk=2, d=16, dtype=torch.float32):
    return (torch.randn(tq, hq, d).to(dtype), torch.randn(tk, hk, d).to(dtype),
            torch.randn(tk, hk, d).to(dtype), flexcp.masks.causal(tq, tk))


def test_shapes_dtypes_and_masks_are_named():
    q, k, v, m = make()
    with pytest.raises(ValueError, match="q has 2 dims, expected \\[Tq, Hq, D\\]"):
        flexcp.attention(q[:, 0], k, v, m)
    with pytest.raises(ValueError, match="q has 4 heads and k 3, expected Hq to be a multiple of Hk"):
        flexcp.attention(q, torch.randn(10, 3, 16), torch.randn(10, 3, 16), m)
    with pytest.raises(ValueError, match="k has dtype bf16, expected fp32"):
        flexcp.attention(q, k.bfloat16(), v, m)
    with pytest.raises(ValueError, match="q has 8 tokens but the mask has seqlen_q 9"):
        flexcp.attention(q, k, v, flexcp.masks.causal(9, 10))
    with pytest.raises(ValueError, match="v has shape \\[10, 2, 8\\], expected dim 2 to be 16"):
        flexcp.attention(q, k, torch.randn(10, 2, 8), m)
    with pytest.raises(ValueError, match="sink has shape \\[3\\], expected dim 0 to be 4"):
        flexcp.attention(q, k, v, m, sink=torch.zeros(3))
    for dtype in (torch.int32, torch.bfloat16):  # one logit a q head, in fp32 whatever q's dtype
        with pytest.raises(ValueError, match=f"sink has dtype {dtype}, expected torch.float32"):
            flexcp.attention(q, k, v, m, sink=torch.zeros(4, dtype=dtype))
    with pytest.raises(ValueError, match="softcap is -1.000000, expected a finite number >= 0"):
        flexcp.attention(q, k, v, m, softcap=-1.0)
    with pytest.raises(ValueError, match="q has dtype torch.int64, expected torch.float32, "
                                         "torch.bfloat16 or torch.float16"):
        flexcp.attention(q.long(), k.long(), v.long(), m)
    with pytest.raises(ValueError, match="v has dtype torch.complex64"):
        flexcp.attention(q, k, v.to(torch.complex64), m)
    with pytest.raises(ValueError, match="k has layout torch.sparse_coo, expected torch.strided"):
        flexcp.attention(q, k.to_sparse(), v, m)
    with pytest.raises(ValueError, match="mask must be a flexcp.Mask"):
        flexcp.attention(q, k, v, "causal")
    with pytest.raises(ValueError, match="k must be a torch.Tensor"):
        flexcp.attention(q, k.numpy(), v, m)


def test_the_module_names_a_dtype_it_cannot_take():
    # What reaches the compiled module from any DLPack producer (the public functions check
    # torch's dtypes first, in torch's words).
    q, k, v, m = make()
    out, lse = torch.empty_like(q), torch.empty(q.shape[:2])
    for bad, name in ((torch.int16, "int16"), (torch.uint8, "uint8"), (torch.bool, "bool"),
                      (torch.complex64, "complex64")):
        with pytest.raises(ValueError, match=f"k has dtype {name}, expected "
                                             "float32, bfloat16 or float16"):
            flexcp._flexcp.forward(q, k.to(bad), v, m._mask, out, lse, 0.25, 0.0, None, 0)


def test_options_that_are_not_real_numbers_are_named():
    q, k, v, m = make()
    with pytest.raises(ValueError, match="flexcp.attention: scale must be a real number, got str"):
        flexcp.attention(q, k, v, m, scale="0.1")
    with pytest.raises(ValueError, match="softcap must be a real number, got NoneType"):
        flexcp.attention(q, k, v, m, softcap=None)
    with pytest.raises(ValueError, match="scale must be a real number, got bool"):
        flexcp.attention(q, k, v, m, scale=True)
    # An int to Python, but never a head count or a length a user meant.
    with pytest.raises(ValueError, match="flexcp.AttentionPlan: heads_q is True, expected an "
                                         "integer"):
        flexcp.AttentionPlan(m, True, 1, 16, dtype=torch.float32)
    with pytest.raises(ValueError, match="seqlen_q is False, expected an integer"):
        flexcp.masks.causal(False)


def test_a_zero_scale_is_refused_not_replaced():
    # The C++ options read scale 0 as 1/sqrt(D); a 0 given in Python must not become that.
    q, k, v, m = make()
    with pytest.raises(ValueError, match="scale is 0, expected a nonzero number "
                                         "\\(None for 1/sqrt\\(D\\)\\)"):
        flexcp.attention(q, k, v, m, scale=0.0)
    with pytest.raises(ValueError, match="scale is 0"):
        flexcp.attention(q, k, v, m, scale=-0.0)


def test_inputs_are_left_alone():
    q, k, v, m = make()
    before = [t.clone() for t in (q, k, v)]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, _ = flexcp.attention(*leaves, m)
    out.sum().backward()
    for t, leaf, b in zip((q, k, v), leaves, before):
        assert torch.equal(t, b) and torch.equal(leaf.detach(), b)


def test_a_deterministic_flag_that_is_not_a_bool_is_named():
    q, k, v, m = make(d=16, dtype=torch.float32)
    with pytest.raises(ValueError, match="deterministic must be a bool, got str"):
        flexcp.attention(q, k, v, m, deterministic="yes")



class _OneRank:
    """The communicator interface flexcp's C++ side calls, for one rank (no torch.distributed)."""

    def rank(self):
        return 0

    def size(self):
        return 1


def test_a_distributed_device_or_backend_that_does_not_exist_is_named():
    mask = flexcp.masks.causal(64, 64)
    with pytest.raises(ValueError, match="device is 'tpu', expected 'cpu' or 'cuda'"):
        flexcp._flexcp.DistComm(_OneRank(), device="tpu")
    host = flexcp._flexcp.DistComm(_OneRank())
    with pytest.raises(ValueError, match="device is 'tpu', expected 'cpu' or 'cuda'"):
        flexcp._flexcp.DistAttention(mask._mask, host, 4, 2, 64, "bf16", device="tpu")
    # A plan for device tensors over host communicators (or the reverse) is named.
    with pytest.raises(ValueError, match="communicators are for another device than 'cuda'"):
        flexcp._flexcp.DistAttention(mask._mask, host, 4, 2, 64, "bf16", device="cuda")
    if flexcp._flexcp.built_with_cuda():
        with pytest.raises(ValueError, match="backend is 'gloo', expected 'nccl' or 'staged'"):
            flexcp._flexcp.DistComm(_OneRank(), device="cuda", backend="gloo")
    else:  # the CUDA communicators are not in this build: said, not a crash
        with pytest.raises(RuntimeError, match="not compiled"):
            flexcp._flexcp.DistComm(_OneRank(), device="cuda", backend="nccl")
