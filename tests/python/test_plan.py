"""flexcp.AttentionPlan: a plan gives the bits of the per-call mask path (which test_attention.py
checks against the float64 reference), serves any number of calls and layers, names every
disagreement with the tensors it is given, says when it has been released, traces under
torch.compile, and on CUDA runs from a workspace torch allocated, inside a captured CUDA graph."""
import copy
import gc
import pickle
import random

import pytest
import torch

import flexcp
from reference import random_mask_slices
from test_attention import inputs, needs_cuda


def run(mask_or_plan, q, k, v, dout, sink=None, **options):
    """out, lse and the gradients of q, k, v (and sink) of one forward and backward."""
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    sg = None if sink is None else sink.clone().requires_grad_()
    out, lse = flexcp.attention(qg, kg, vg, mask_or_plan, sink=sg, **options)
    out.backward(dout)
    grads = [qg.grad, kg.grad, vg.grad] + ([] if sink is None else [sg.grad])
    return [out.detach(), lse] + grads


def assert_same_bits(got, want):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, i
        assert torch.equal(g.contiguous().view(torch.uint8), w.contiguous().view(torch.uint8)), i


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_plan_gives_the_mask_paths_bits(dtype):
    rng = random.Random(5)
    for seed, (mask, hq, hk, d, options) in enumerate([
        (flexcp.masks.varlen_causal([30, 1, 70, 12]), 8, 2, 32, {}),
        (flexcp.Mask(random_mask_slices(rng, 97, 131), 97, 131), 4, 1, 16,
         dict(softcap=7.0, scale=0.4)),
        (flexcp.masks.sliding_window([90, 50], 17), 4, 4, 16, dict(deterministic=True)),
    ]):
        with_sink = seed == 1
        q, k, v, dout, sink = inputs(seed + 40, mask.seqlen_q, mask.seqlen_k, hq, hk, d, dtype,
                                     with_sink)
        plan = flexcp.AttentionPlan(mask, hq, hk, d, dtype=dtype)
        want = run(mask, q, k, v, dout, sink, **options)
        # The plan twice: a second call must not see anything the first one left.
        for _ in range(2):
            assert_same_bits(run(plan, q, k, v, dout, sink, **options), want)


def test_layers_share_one_plan_forwards_in_order_backwards_reversed():
    mask = flexcp.masks.block_causal([100, 37], 24)
    plan = flexcp.AttentionPlan(mask, 4, 2, 16, dtype=torch.float32)
    q, k, v, dout, _ = inputs(7, 137, 137, 4, 2, 16, torch.float32)

    def two_layers(m):
        x = q.clone().requires_grad_()
        h, _ = flexcp.attention(x, k, v, m)
        out, _ = flexcp.attention(h, k, v, m)
        out.backward(dout)
        return [out.detach(), x.grad]

    assert_same_bits(two_layers(plan), two_layers(mask))


def test_a_plan_names_what_disagrees_with_its_tensors():
    mask = flexcp.masks.causal(50)
    plan = flexcp.AttentionPlan(mask, 4, 2, 16, dtype=torch.float32)
    q, k, v, dout, _ = inputs(3, 50, 50, 4, 2, 16, torch.float32)
    with pytest.raises(ValueError, match=r"q has shape \[50, 2, 16\].*\[50, 4, 16\].*plan's shape"):
        flexcp.attention(q[:, :2], k, v, plan)
    with pytest.raises(ValueError, match=r"k has shape \[49, 2, 16\].*plan's shape"):
        flexcp.attention(q, k[:49], v[:49], plan)
    with pytest.raises(ValueError, match="q has dtype bf16, expected fp32 .the plan's dtype"):
        flexcp.attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), plan)
    with pytest.raises(ValueError, match="head_dim|shape"):
        flexcp.attention(q[..., :8], k[..., :8], v[..., :8], plan)
    # Autocast turns float32 inputs into bfloat16: the plan built for float32 says so.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(ValueError, match="plan's dtype"):
            flexcp.attention(q, k, v, plan)

    forward_only = flexcp.AttentionPlan(mask, 4, 2, 16, dtype=torch.float32, backward=False)
    assert not forward_only.has_backward and plan.has_backward
    out, _ = flexcp.attention(q.requires_grad_(), k, v, forward_only)
    with pytest.raises(RuntimeError, match="forward only"):
        out.backward(dout)


@pytest.mark.parametrize("args, message", [
    (dict(mask="causal"), "mask must be a flexcp.Mask, got str"),
    (dict(heads_q=2.5), "heads_q"),
    (dict(head_dim=2**70), "head_dim is 1180591620717411303424, expected an integer within int64"),
    (dict(heads_kv=0), "heads_q 4 and heads_kv 0"),
    (dict(heads_q=3), "heads_q 3 and heads_kv 2"),
    (dict(head_dim=0), "head_dim"),
    (dict(dtype=torch.float64), "dtype is torch.float64"),
    (dict(dtype="bf16"), "dtype is 'bf16'"),
    (dict(device="mps"), "device is mps, expected cpu or cuda"),
    (dict(device="no such device"), "device is 'no such device'"),
    (dict(backward=1), "backward must be a bool"),
])
def test_bad_plan_arguments_are_named(args, message):
    kwargs = dict(mask=flexcp.masks.causal(20), heads_q=4, heads_kv=2, head_dim=16,
                  dtype=torch.float32)
    kwargs.update(args)
    with pytest.raises(ValueError, match=message):
        flexcp.AttentionPlan(**kwargs)


def test_a_released_plan_is_named_not_run():
    mask = flexcp.masks.causal(20)
    plan = flexcp.AttentionPlan(mask, 2, 1, 16, dtype=torch.float32)
    q, k, v, dout, _ = inputs(9, 20, 20, 2, 1, 16, torch.float32)
    out, _ = flexcp.attention(q.requires_grad_(), k, v, plan)
    plan_id = plan.id
    del plan
    gc.collect()
    with pytest.raises(RuntimeError, match=f"AttentionPlan {plan_id} has been released"):
        out.backward(dout)
    args = (q, k, v, mask._slices, 20, 20, plan_id, 0.25, 0.0, None, False)
    with pytest.raises(RuntimeError, match="has been released"):
        torch.ops.flexcp.attention_forward.default(*args)


def test_compile_fullgraph_with_plans_matches_eager():
    from test_compile import Block
    torch.manual_seed(1)
    mask = flexcp.masks.varlen_causal([37, 64, 27])
    blocks = [Block(64, 4, 2, flexcp.AttentionPlan(mask, 4, 2, 16, dtype=torch.float32))
              for _ in range(2)]
    model = torch.nn.Sequential(*blocks)
    x = torch.randn(128, 64)
    eager_x = x.clone().requires_grad_()
    eager = model(eager_x)
    eager.square().sum().backward()
    compiled_x = x.clone().requires_grad_()
    compiled = torch.compile(model, fullgraph=True)(compiled_x)
    compiled.square().sum().backward()
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(compiled_x.grad, eager_x.grad, rtol=1e-5, atol=1e-5)


def test_a_compiled_step_given_a_new_plan_each_batch_does_not_recompile_each_time():
    # Packed batches change their documents every step, so a plan is made per batch: the compiled
    # function must settle on a graph whose plan id is an input, not recompile per batch, and
    # still run each batch's own plan.
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    @torch.compile(backend=counting, fullgraph=True)
    def loss(q, k, v, plan):
        out, _ = flexcp.attention(q, k, v, plan)
        return out.square().sum()

    rng = random.Random(8)
    for batch in range(8):
        docs = [rng.randint(1, 40) for _ in range(rng.randint(2, 6))]
        mask = flexcp.masks.varlen_causal(docs)
        plan = flexcp.AttentionPlan(mask, 4, 2, 16, dtype=torch.float32)
        q, k, v, _, _ = inputs(batch, mask.seqlen_q, mask.seqlen_k, 4, 2, 16, torch.float32)
        xs = [t.clone().requires_grad_() for t in (q, k, v)]
        got = loss(*xs, plan)
        got.backward()
        ref = [t.clone().requires_grad_() for t in (q, k, v)]
        want = flexcp.attention(*ref, mask)[0].square().sum()  # eager, over the mask
        want.backward()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        for x, r in zip(xs, ref):
            torch.testing.assert_close(x.grad, r.grad, rtol=1e-5, atol=1e-5)
    assert len(graphs) <= 3, f"{len(graphs)} compilations for 8 plans"


def test_the_ops_pass_torch_library_checks_with_a_plan():
    mask = flexcp.masks.causal(33)
    plan = flexcp.AttentionPlan(mask, 4, 2, 16, dtype=torch.float32)
    q = torch.randn(33, 4, 16, requires_grad=True)
    k = torch.randn(33, 2, 16, requires_grad=True)
    v = torch.randn(33, 2, 16, requires_grad=True)
    sink = torch.randn(4, requires_grad=True)
    args = (q, k, v, mask._slices, 33, 33, plan.id, 0.0, 0.0, sink, False)
    torch.library.opcheck(torch.ops.flexcp.attention_forward.default, args)


def test_meta_tensors_with_a_plan_give_the_outputs_shapes():
    mask = flexcp.masks.varlen_causal([5, 7])
    plan = flexcp.AttentionPlan(mask, 6, 3, 32, dtype=torch.bfloat16)
    make = lambda h: torch.empty(12, h, 32, device="meta", dtype=torch.bfloat16,
                                 requires_grad=True)
    q, k, v = make(6), make(3), make(3)
    out, lse = flexcp.attention(q, k, v, plan)
    assert (out.device.type, out.shape, lse.shape) == ("meta", (12, 6, 32), (12, 6))
    out.sum().backward()
    assert (k.grad.device.type, k.grad.shape) == ("meta", (12, 3, 32))


def test_a_copied_or_unpickled_plan_is_planned_again():
    mask = flexcp.masks.varlen_causal([30, 1, 70, 12])
    plan = flexcp.AttentionPlan(mask, 4, 2, 16, dtype=torch.float32, backward=False)
    q, k, v, _, _ = inputs(21, 113, 113, 4, 2, 16, torch.float32)
    want = flexcp.attention(q, k, v, plan)
    for f in (copy.copy, copy.deepcopy, lambda p: pickle.loads(pickle.dumps(p))):
        got = f(plan)
        assert got.id != plan.id and got._plan is not plan._plan
        assert (got.heads_q, got.heads_kv, got.head_dim, got.dtype, got.device,
                got.has_backward) == (4, 2, 16, torch.float32, torch.device("cpu"), False)
        assert_same_bits(list(flexcp.attention(q, k, v, got)), list(want))
    # A model that holds plans deep-copies (an averaged model, say) and computes the same.
    from test_compile import Block
    block = Block(64, 4, 2, flexcp.AttentionPlan(mask, 4, 2, 16, dtype=torch.float32))
    twin = copy.deepcopy(block)
    assert twin.mask.id != block.mask.id
    x = torch.randn(113, 64)
    assert torch.equal(twin(x), block(x))


def test_a_host_plan_holds_no_workspace():
    plan = flexcp.AttentionPlan(flexcp.masks.causal(64), 2, 2, 16, dtype=torch.float32)
    assert plan.workspace_bytes == 0
    assert plan.area() == flexcp.masks.causal(64).area() == 64 * 65 // 2
    assert "forward and backward" in repr(plan)


# On the GPU (skipped elsewhere).

def cuda_case(seed, mask, hq, hk, d, dtype=torch.bfloat16):
    q, k, v, dout, sink = inputs(seed, mask.seqlen_q, mask.seqlen_k, hq, hk, d, dtype, True)
    return [t.cuda() for t in (q, k, v, dout, sink)]


@needs_cuda
@pytest.mark.parametrize("d, dtype", [(128, torch.bfloat16), (64, torch.float16)])
def test_cuda_plan_gives_the_mask_paths_bits(d, dtype):
    mask = flexcp.masks.varlen_causal([300, 1, 129, 200])
    q, k, v, dout, sink = cuda_case(11, mask, 8, 2, d, dtype)
    plan = flexcp.AttentionPlan(mask, 8, 2, d, dtype=dtype, device="cuda")
    assert plan.workspace_bytes > 0 and plan.device.index == torch.cuda.current_device()
    want = run(mask, q, k, v, dout, sink, deterministic=True, softcap=9.0)
    for _ in range(2):
        assert_same_bits(run(plan, q, k, v, dout, sink, deterministic=True, softcap=9.0), want)


@needs_cuda
def test_cuda_plan_workspace_comes_from_torch_and_serves_another_stream():
    mask = flexcp.masks.causal(1000)
    before = torch.cuda.memory_allocated()
    plan = flexcp.AttentionPlan(mask, 4, 2, 128, device="cuda")
    assert torch.cuda.memory_allocated() - before >= plan.workspace_bytes
    q, k, v, dout, sink = cuda_case(12, mask, 4, 2, 128)
    want = run(plan, q, k, v, dout, sink, deterministic=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = run(plan, q, k, v, dout, sink, deterministic=True)
    torch.cuda.current_stream().wait_stream(side)
    assert_same_bits(got, want)
    # A plan built for the GPU refuses host tensors, naming the device.
    with pytest.raises(ValueError, match="plan's device"):
        flexcp.attention(q.cpu(), k.cpu(), v.cpu(), plan)


@needs_cuda
def test_cuda_graph_replays_a_planned_training_step():
    mask = flexcp.masks.varlen_causal([300, 1, 129, 200])
    plan = flexcp.AttentionPlan(mask, 8, 2, 128, device="cuda")
    q, k, v, dout, sink = cuda_case(13, mask, 8, 2, 128)
    static = [t.clone().requires_grad_(i < 3) for i, t in enumerate((q, k, v, dout))]
    sq, sk, sv, sdout = static

    def step():
        for t in (sq, sk, sv):
            t.grad = None
        out, _ = flexcp.attention(sq, sk, sv, plan, deterministic=True)
        out.backward(sdout)
        return out

    side = torch.cuda.Stream()  # warm-up off the default stream, as torch.cuda.graph asks
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step()
    for seed in (14, 15):
        nq, nk, nv, ndout, _ = cuda_case(seed, mask, 8, 2, 128)
        for dst, src in zip(static, (nq, nk, nv, ndout)):
            dst.detach().copy_(src)
        # Poison what the replay must write.
        static_out.detach().fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want = run(plan, nq, nk, nv, ndout, deterministic=True)
        assert_same_bits([static_out.detach(), sq.grad, sk.grad, sv.grad],
                         [want[0]] + want[2:])


@needs_cuda
def test_a_mask_call_in_a_cuda_graph_capture_is_refused():
    mask = flexcp.masks.causal(256)
    q, k, v, _, _ = cuda_case(16, mask, 2, 2, 128)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="capturing a CUDA graph.*AttentionPlan"):
        with torch.cuda.graph(graph):
            flexcp.attention(q, k, v, mask)


@pytest.mark.skipif(flexcp.built_with_cuda(), reason="this build has the CUDA kernels")
def test_a_cuda_plan_in_a_build_without_cuda_says_so():
    with pytest.raises(RuntimeError, match="no CUDA kernels"):
        flexcp.AttentionPlan(flexcp.masks.causal(64), 2, 2, 128, device="cuda")
