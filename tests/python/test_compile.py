"""torch.compile(fullgraph=True) traces a module that calls flexcp.attention, forward and backward,
with no graph break, and gives the eager results."""
import pytest
import torch

import flexcp


class Block(torch.nn.Module):
    def __init__(self, dim, heads, heads_kv, mask):
        super().__init__()
        self.heads, self.heads_kv, self.head_dim = heads, heads_kv, dim // heads
        self.q = torch.nn.Linear(dim, dim, bias=False)
        self.kv = torch.nn.Linear(dim, 2 * heads_kv * self.head_dim, bias=False)
        self.o = torch.nn.Linear(dim, dim, bias=False)
        self.mask = mask

    def forward(self, x):
        t = x.shape[0]
        q = self.q(x).view(t, self.heads, self.head_dim)
        k, v = self.kv(x).view(t, 2, self.heads_kv, self.head_dim).unbind(1)
        out, _ = flexcp.attention(q, k, v, self.mask, softcap=20.0)
        return self.o(out.reshape(t, -1))


def test_compile_fullgraph_forward_and_backward_match_eager():
    torch.manual_seed(0)
    mask = flexcp.masks.varlen_causal([37, 64, 27])
    block = Block(64, 4, 2, mask)
    x = torch.randn(128, 64)
    eager_x = x.clone().requires_grad_()
    eager = block(eager_x)
    eager.square().sum().backward()
    eager_grads = [p.grad.clone() for p in block.parameters()]
    block.zero_grad()

    compiled_block = torch.compile(block, fullgraph=True)
    comp_x = x.clone().requires_grad_()
    comp = compiled_block(comp_x)
    comp.square().sum().backward()
    torch.testing.assert_close(comp, eager, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(comp_x.grad, eager_x.grad, rtol=1e-5, atol=1e-5)
    for p, g in zip(block.parameters(), eager_grads):
        torch.testing.assert_close(p.grad, g, rtol=1e-5, atol=1e-5)


def test_the_ops_pass_torch_library_checks():
    # opcheck: schema, fake (meta) implementation and autograd registration agree with the real op.
    mask = flexcp.masks.causal(33)
    q = torch.randn(33, 4, 16, requires_grad=True)
    k = torch.randn(33, 2, 16, requires_grad=True)
    v = torch.randn(33, 2, 16, requires_grad=True)
    sink = torch.randn(4, requires_grad=True)
    args = (q, k, v, mask._slices, mask.seqlen_q, mask.seqlen_k, 0, 0.0, 0.0, sink, False)
    torch.library.opcheck(torch.ops.flexcp.attention_forward.default, args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_meta_tensors_give_the_outputs_shapes_forward_and_backward(dtype):
    # A model built on the meta device (shape inference, flop counting before weights exist):
    # outputs and gradients come back as meta tensors of the real call's shapes and dtypes.
    mask = flexcp.masks.varlen_causal([5, 7])
    make = lambda h: torch.empty(12, h, 32, device="meta", dtype=dtype, requires_grad=True)
    q, k, v = make(6), make(3), make(3)
    out, lse = flexcp.attention(q, k, v, mask)
    assert (out.device.type, out.shape, out.dtype) == ("meta", (12, 6, 32), dtype)
    assert (lse.device.type, lse.shape, lse.dtype) == ("meta", (12, 6), torch.float32)
    out.sum().backward()
    for t in (q, k, v):
        assert (t.grad.device.type, t.grad.shape, t.grad.dtype) == ("meta", t.shape, dtype)
