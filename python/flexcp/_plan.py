"""flexcp.AttentionPlan: a mask planned once for one shape, dtype and device, then run by
flexcp.attention any number of times (layers, steps) without planning again, and on the GPU
without an allocation or a host-to-device copy per call, so that a captured CUDA graph can hold
the calls."""
import itertools
import weakref

import torch

from . import _flexcp
from ._args import integer
from ._mask import Mask

_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}

# The torch ops take tensors and numbers, so a plan reaches them as its id. Weak: an entry goes
# with its plan (this holds nothing alive; an op given a released plan's id says so).
_plans = weakref.WeakValueDictionary()
_ids = itertools.count(1)


def plan_of(plan_id: int, fn: str):
    plan = _plans.get(plan_id)
    if plan is None:
        raise RuntimeError(f"{fn}: flexcp.AttentionPlan {plan_id} has been released; keep the "
                           "plan alive while anything that was built with it (a compiled "
                           "function, a captured graph, a pending backward) may still run")
    return plan


class AttentionPlan:
    """`mask` planned for q [mask.seqlen_q, heads_q, head_dim] and k, v [mask.seqlen_k,
    heads_kv, head_dim] of `dtype` on `device`; pass it to flexcp.attention in place of the mask:

        plan = flexcp.AttentionPlan(mask, heads_q=64, heads_kv=8, head_dim=128,
                                    dtype=torch.bfloat16, device="cuda")
        out, lse = flexcp.attention(q, k, v, plan)      # every layer, every step

    With backward=False the plan serves the forward only (inference) and its workspace is a few
    kilobytes. On CUDA the workspace (work lists and, for the backward, an fp32 dQ accumulator of
    seqlen_q x heads_q x head_dim) is allocated once through torch's allocator and written on the
    current stream (no host wait: a mask that changes every batch is planned every batch); a call
    on another stream first waits for that on the device. A plan runs one call at a time, in
    stream order: layers sharing it on one stream (autograd runs each backward on its forward's
    stream) are fine; calls on two streams at once need two plans. A captured graph reads the
    workspace when it replays: keep the plan while the graph lives.
    """

    def __init__(self, mask, heads_q, heads_kv, head_dim, dtype=torch.bfloat16, device="cpu",
                 backward=True):
        fn = "flexcp.AttentionPlan"
        if not isinstance(mask, Mask):
            raise ValueError(f"{fn}: mask must be a flexcp.Mask, got {type(mask).__name__}")
        self.heads_q = integer(fn, "heads_q", heads_q)
        self.heads_kv = integer(fn, "heads_kv", heads_kv)
        self.head_dim = integer(fn, "head_dim", head_dim)
        if dtype not in _DTYPE_NAMES:
            raise ValueError(f"{fn}: dtype is {dtype!r}, expected torch.float32, torch.bfloat16 "
                             "or torch.float16")
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"{fn}: device is {device!r}, expected a torch.device, 'cpu' or "
                             f"'cuda[:N]' ({e})") from None
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"{fn}: device is {device}, expected cpu or cuda")
        if device.type == "cuda" and device.index is None and _flexcp.built_with_cuda():
            # (A build without CUDA kernels says so itself, below.)
            device = torch.device("cuda", torch.cuda.current_device())
        if not isinstance(backward, bool):
            raise ValueError(f"{fn}: backward must be a bool, got {type(backward).__name__}")
        self.mask, self.dtype, self.device = mask, dtype, device
        self._plan = _flexcp.AttentionPlan(mask._mask, self.heads_q, self.heads_kv,
                                           self.head_dim, _DTYPE_NAMES[dtype], device.type,
                                           device.index or 0, backward)
        self._workspace = None
        self._streams_used = set()  # streams that have waited for the lists (and their own)
        if device.type == "cuda":
            nbytes = self._plan.workspace_bytes()
            stream = torch.cuda.current_stream(device)
            self._workspace = torch.empty(nbytes, dtype=torch.uint8, device=device)
            self._plan.bind_workspace(self._workspace.data_ptr(), nbytes, stream.cuda_stream)
            self._written = torch.cuda.Event()
            self._written.record(stream)
            self._streams_used.add(stream.cuda_stream)
        self.id = next(_ids)
        _plans[self.id] = self

    @property
    def has_backward(self):
        return self._plan.has_backward()

    @property
    def workspace_bytes(self):
        """Device memory the plan holds (0 on the CPU)."""
        return self._plan.workspace_bytes()

    def area(self):
        """Attended (q, k) pairs."""
        return self._plan.area()

    def _used_on(self, stream):
        # A stream other than the one that wrote the lists waits for them on the device, once, and
        # the workspace must not go back to torch's allocator before that stream's work is done
        # (record_stream: the allocator waits for each recorded stream when the block is freed).
        # A capture is different: torch.cuda.graph synchronises the device before it captures, a
        # graph may not wait for an event recorded outside it, and it replays later: the plan must
        # outlive it.
        if (self._workspace is None or stream.cuda_stream in self._streams_used
                or torch.cuda.is_current_stream_capturing()):
            return
        stream.wait_event(self._written)
        self._workspace.record_stream(stream)
        self._streams_used.add(stream.cuda_stream)

    def __reduce__(self):
        # A copy (copy.copy, copy.deepcopy of a model holding it) or an unpickled plan is planned
        # again: its own workspace and id, so that it may run beside this one.
        return (AttentionPlan, (self.mask, self.heads_q, self.heads_kv, self.head_dim, self.dtype,
                                str(self.device), self.has_backward))

    def __repr__(self):
        kind = "forward and backward" if self.has_backward else "forward only"
        return (f"flexcp.AttentionPlan(seqlen_q={self.mask.seqlen_q}, "
                f"seqlen_k={self.mask.seqlen_k}, heads_q={self.heads_q}, "
                f"heads_kv={self.heads_kv}, head_dim={self.head_dim}, dtype={self.dtype}, "
                f"device={self.device}, {kind}, workspace_bytes={self.workspace_bytes})")
