"""flexcp.attention: the kernels as torch.library custom ops, with their fake (meta) versions and
autograd, so that torch.compile(fullgraph=True) traces a model that calls them without a break.
A custom op's arguments are tensors and numbers: the ops take the mask as an int64 [n, 5] slice
tensor plus its lengths, and rebuild the validated C++ mask on each call, or, given a plan's id
(flexcp.AttentionPlan; 0 for none), run that plan."""
from typing import Optional, Tuple, Union

import torch
from torch.utils.dlpack import to_dlpack

from . import _flexcp
from ._args import real_number, scale_option
from ._mask import Mask
from ._plan import AttentionPlan, plan_of

_LOW_PRECISION = (torch.bfloat16, torch.float16)
_DTYPES = (torch.float32,) + _LOW_PRECISION
# Where torch.autocast exists; on others (meta: shapes only) it is not asked.
_AUTOCAST_DEVICES = ("cpu", "cuda")


def _current_stream(t: torch.Tensor) -> Optional[torch.cuda.Stream]:
    return torch.cuda.current_stream(t.device) if t.is_cuda else None


def _raw(stream: Optional[torch.cuda.Stream]) -> int:
    return 0 if stream is None else stream.cuda_stream


def _dlpack(*tensors):
    """The tensors as DLPack capsules for the module: what it would take from each tensor's
    __dlpack__, whose checks in Python cost ~2.5 us a tensor (15 tensors a training step); the
    tensors here are the ops' own (detached, strided, on one device), and the stream is passed
    to the module explicitly, so no stream synchronisation is skipped."""
    return tuple(None if t is None else to_dlpack(t) for t in tensors)


def _mask(slices: torch.Tensor, seqlen_q: int, seqlen_k: int):
    return _flexcp.Mask.from_array(slices, seqlen_q, seqlen_k)


def _plan(plan_id: int, q: torch.Tensor, stream: Optional[torch.cuda.Stream], fn: str):
    """The C++ plan of `plan_id`, noted as used on q's stream."""
    plan = plan_of(plan_id, fn)
    if q.device == plan.device and stream is not None:  # (another device: the C++ side names it)
        plan._used_on(stream)
    return plan._plan


@torch.library.custom_op("flexcp::attention_forward", mutates_args=())
def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slices: torch.Tensor,
             seqlen_q: int, seqlen_k: int, plan_id: int, scale: float, softcap: float,
             sink: Optional[torch.Tensor], deterministic: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    # `deterministic` is for the backward (the forward always is); it is an argument here so
    # that autograd's context sees it.
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    stream = _current_stream(q)
    tensors = _dlpack(q.detach(), k.detach(), v.detach())
    outputs = _dlpack(out, lse)
    numbers = (scale, softcap, *_dlpack(None if sink is None else sink.detach()), _raw(stream))
    if plan_id:
        _flexcp.forward_planned(_plan(plan_id, q, stream, "flexcp.attention"), *tensors,
                                *outputs, *numbers)
    else:
        _flexcp.forward(*tensors, _mask(slices, seqlen_q, seqlen_k), *outputs, *numbers)
    return out, lse


@_forward.register_fake
def _(q, k, v, slices, seqlen_q, seqlen_k, plan_id, scale, softcap, sink, deterministic):
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            q.new_empty(q.shape[:2], dtype=torch.float32))


def _readable_by_the_kernel(dout: torch.Tensor) -> torch.Tensor:
    """The output's gradient comes in whatever layout the code after the call made (out.sum()
    gives an expanded scalar: strides 0), and the CUDA kernel reads rows by TMA (a unit stride
    along D, 16-byte aligned rows): any other layout is copied first. (q, k and v are the
    caller's own tensors: their layout is named when it does not fit.)"""
    if not dout.is_cuda:
        return dout
    esize = dout.element_size()
    fits = (dout.stride(-1) == 1 and dout.data_ptr() % 16 == 0
            and all(s * esize % 16 == 0 for s in dout.stride()[:-1]))
    return dout if fits else dout.contiguous()


@torch.library.custom_op("flexcp::attention_backward", mutates_args=())
def _backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              out: torch.Tensor, lse: torch.Tensor, slices: torch.Tensor, seqlen_q: int,
              seqlen_k: int, plan_id: int, scale: float, softcap: float,
              sink: Optional[torch.Tensor],
              deterministic: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    # Without a sink its gradient is an empty tensor (an op returns tensors only).
    dsink = torch.empty_like(sink) if sink is not None else q.new_empty(0, dtype=torch.float32)
    stream = _current_stream(q)
    inputs = _dlpack(_readable_by_the_kernel(dout.detach()), q.detach(), k.detach(), v.detach(),
                     out.detach(), lse.detach())
    rest = (*_dlpack(dq, dk, dv), scale, softcap,
            *_dlpack(None if sink is None else sink.detach(), None if sink is None else dsink),
            deterministic, _raw(stream))
    if plan_id:
        _flexcp.backward_planned(_plan(plan_id, q, stream, "flexcp.attention (backward)"),
                                 *inputs, *rest)
    else:
        _flexcp.backward(*inputs, _mask(slices, seqlen_q, seqlen_k), *rest)
    return dq, dk, dv, dsink


@_backward.register_fake
def _(dout, q, k, v, out, lse, slices, seqlen_q, seqlen_k, plan_id, scale, softcap, sink,
      deterministic):
    dsink = torch.empty_like(sink) if sink is not None else q.new_empty(0, dtype=torch.float32)
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format),
            torch.empty_like(v, memory_format=torch.contiguous_format), dsink)


def _setup_context(ctx, inputs, output):
    q, k, v, slices, seqlen_q, seqlen_k, plan_id, scale, softcap, sink, deterministic = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, slices, sink)
    ctx.lengths = (seqlen_q, seqlen_k)
    # Only the id: the plan must still be alive when the backward runs (it says so if not). A
    # reference here would tie the plan's lifetime to autograd graphs, which may outlive the
    # interpreter's modules.
    ctx.plan_id = plan_id
    ctx.numbers = (scale, softcap)
    ctx.deterministic = deterministic
    # NOTE: lse carries no gradient (the kernels' backward has no dlse input); marking it so
    # makes a use of its gradient an error in autograd instead of a silent zero.
    ctx.mark_non_differentiable(lse)


def _grad(ctx, dout, dlse):
    q, k, v, out, lse, slices, sink = ctx.saved_tensors
    dq, dk, dv, dsink = _backward(dout, q, k, v, out, lse, slices, *ctx.lengths, ctx.plan_id,
                                  *ctx.numbers, sink, ctx.deterministic)
    return (dq, dk, dv, None, None, None, None, None, None,
            (dsink if sink is not None else None), None)


torch.library.register_autograd("flexcp::attention_forward", _grad, setup_context=_setup_context)


class _Attention(torch.autograd.Function):
    """The same autograd as the op's registration above, which serves a direct call of
    torch.ops.flexcp.attention_forward; flexcp.attention goes through this Function instead.
    torch.library's autograd layer rebuilds the call's arguments from the schema in Python on
    every call (tens of microseconds of host time a training step:
    bench/results/python-host-2026-12-05.md); a Function does that in C++, and inside its
    forward the op runs without autograd. torch.compile traces it as it traces the op's
    registration."""

    # (forward with ctx rather than a setup_context: apply binds a setup_context Function's
    # arguments with inspect.signature on every call, ~30 us.)
    @staticmethod
    def forward(ctx, *inputs):
        output = _forward(*inputs)
        _setup_context(ctx, inputs, output)
        return output

    backward = staticmethod(_grad)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Union[Mask, AttentionPlan],
              scale: Optional[float] = None, softcap: float = 0.0,
              sink: Optional[torch.Tensor] = None, deterministic: bool = False):
    """Exact attention over `mask` (docs/masks.md).

    q [Tq, Hq, D], k and v [Tk, Hk, D] (Hq a multiple of Hk), one dtype of float32, bfloat16 or
    float16, on the CPU or one CUDA device (float32 on the CPU only); on the meta device (or
    under torch.compile's fake tensors) the outputs' shapes and dtypes, nothing computed.
    `mask`: a flexcp.Mask (planned on every call), or a flexcp.AttentionPlan built for these
    tensors' shape, dtype and device (planned once; needed where a CUDA graph captures the call).
    Returns out [Tq, Hq, D] (q's dtype) and lse [Tq, Hq] (float32, natural log; -inf and out = 0
    for a row that attends nothing). Differentiable in q, k, v and sink (float32 [Hq]); lse is
    not. `scale` defaults to 1/sqrt(D); `softcap` > 0 caps logits at softcap * tanh(s / softcap).
    Under torch.autocast, float32 inputs run in the autocast dtype. Tensors keep their strides:
    nothing is copied to make them contiguous (the CUDA kernel needs a unit stride along D and
    16-byte aligned rows, and says so when they are not); only the output's gradient, whose
    layout the caller does not choose, is copied when the kernel cannot read it.
    `deterministic`: the CPU backward is deterministic whatever it says; on CUDA dK, dV and dsink
    are, and dQ is summed in arrival order unless `deterministic` is True, which computes dQ in
    its own q-tile-major pass in a fixed order (the same bits on every run, at 0.9x the speed).
    """
    if isinstance(mask, AttentionPlan):
        plan, mask = mask, mask.mask
    elif isinstance(mask, Mask):
        plan = None
    else:
        raise ValueError(f"flexcp.attention: mask must be a flexcp.Mask or a "
                         f"flexcp.AttentionPlan, got {type(mask).__name__}")
    for name, t in (("q", q), ("k", k), ("v", v), ("sink", sink)):
        if t is None and name == "sink":
            continue
        if not isinstance(t, torch.Tensor):
            expected = "a torch.Tensor or None" if name == "sink" else "a torch.Tensor"
            raise ValueError(f"flexcp.attention: {name} must be {expected}, "
                             f"got {type(t).__name__}")
        if t.layout != torch.strided:
            raise ValueError(f"flexcp.attention: {name} has layout {t.layout}, expected "
                             f"torch.strided (a dense tensor)")
        if name != "sink" and t.dtype not in _DTYPES:
            raise ValueError(f"flexcp.attention: {name} has dtype {t.dtype}, expected "
                             f"torch.float32, torch.bfloat16 or torch.float16")
        if name == "sink" and t.dtype != torch.float32:
            raise ValueError(f"flexcp.attention: sink has dtype {t.dtype}, expected "
                             f"torch.float32 (one logit a q head, whatever q's dtype)")
    scale = scale_option("flexcp.attention", scale)
    softcap = real_number("flexcp.attention", "softcap", softcap)
    if not isinstance(deterministic, bool):
        raise ValueError(f"flexcp.attention: deterministic must be a bool, "
                         f"got {type(deterministic).__name__}")
    device_type = q.device.type
    if (q.dtype == torch.float32 and device_type in _AUTOCAST_DEVICES
            and torch.is_autocast_enabled(device_type)):
        low = torch.get_autocast_dtype(device_type)
        if low in _LOW_PRECISION:
            q, k, v = q.to(low), k.to(low), v.to(low)
    args = (q, k, v, mask._slices, mask.seqlen_q, mask.seqlen_k, 0 if plan is None else plan.id,
            scale, softcap, sink, deterministic)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, sink)):
        return _Attention.apply(*args)
    return _forward(*args)  # nothing to differentiate: the op alone
