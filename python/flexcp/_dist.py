"""flexcp.DistAttention over a torch.distributed process group: the C++ runtime plans
and computes; this file gives it a communicator made of a gloo group's point-to-point and
collective calls on host memory (on which the C++ side builds, for CUDA tensors, its own NCCL
communicator or the staged backend), and the autograd of the distributed calls."""
import copy
import ctypes
import os
import sys
import time

import torch
import torch.distributed as dist

from . import _flexcp
from ._args import integer, real_number, scale_option
from ._mask import Mask

_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def _bytes_at(address, nbytes):
    """A uint8 tensor over memory the C++ side owns (no copy)."""
    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(address), dtype=torch.uint8)


# NOTE: gloo runs a collective on a worker thread of its pool, which drops its references to the
# call's tensors a moment after the caller's wait() returned. Under torch 2.15 dropping one takes
# the GIL (a tensor's C++ references keep its Python object alive), so that a worker still doing so
# when the interpreter exits aborts the process ("terminate called without an active exception";
# seen in about one 2-rank run in ten of examples/torch_native, whose own all_reduce it was); under
# torch 2.4 a destroy_process_group() in that moment deadlocked, joining the worker while holding
# the GIL. So every collective here returns only once the worker let go of its tensors: their C++
# and Python reference counts back to what they were before the call, the GIL released meanwhile.
# (Point-to-point sends and receives do not run on that pool; gloo's transport lets go of their
# tensors later, at no fixed point: they are not waited for.)


def _reference_counts(tensors):
    """What holds each host tensor: its C++ and its Python reference counts (device tensors, NCCL's,
    are left out: NCCL's work objects keep them until the stream passed them)."""
    return [(t._use_count(), sys.getrefcount(t)) if not t.is_cuda else (0, 0) for t in tensors]


def _until_gloo_lets_go(tensors, before):
    """Waits until no tensor of `tensors` is held more than `before` (_reference_counts taken
    before the gloo call, with the caller holding the same references)."""
    deadline = time.monotonic() + _timeout_s()
    while any(n[0] > b[0] or n[1] > b[1] for n, b in zip(_reference_counts(tensors), before)):
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"flexcp: gloo still holds the tensors of a completed call after {_timeout_s():g}"
                f" s (FLEXCP_COMM_TIMEOUT_S): reference counts {_reference_counts(tensors)}, "
                f"expected at most {before}")
        time.sleep(0)  # releases the GIL, which the worker may be waiting for


def _collective(call, *tensors, group):
    """call(*tensors, group=group) (a collective that waits), returning once gloo let go of the
    tensors (a list among them stands for its tensors)."""
    flat = [t for x in tensors for t in (x if isinstance(x, list) else [x])]
    before = _reference_counts(flat)
    call(*tensors, group=group)
    _until_gloo_lets_go(flat, before)


def _timeout_s():
    return float(os.environ.get("FLEXCP_COMM_TIMEOUT_S", "120"))


class _Exchange:
    """What `start` returns to the C++ side: wait() for every transfer, then bytes_received."""

    def __init__(self, works, recv_bytes):
        self._works = works
        self.bytes_received = 0
        self._recv_bytes = recv_bytes

    def wait(self):
        import datetime
        timeout = datetime.timedelta(seconds=_timeout_s())
        for w in self._works:
            w.wait(timeout)
        self._works = []
        # gloo reports no per-message counts; a completed receive filled its posted buffer.
        self.bytes_received = self._recv_bytes


class _GroupComm:
    """flexcp's communicator interface over a torch.distributed group."""

    def __init__(self, group):
        self.group = group
        self._rank = dist.get_rank(group)
        self._size = dist.get_world_size(group)
        self._global = [dist.get_global_rank(group, r) if group is not None else r
                        for r in range(self._size)]

    def rank(self):
        return self._rank

    def size(self):
        return self._size

    def start(self, sends, recvs):
        works = []
        recv_bytes = 0
        for peer, address, nbytes, tag in recvs:
            works.append(dist.irecv(_bytes_at(address, nbytes), src=self._global[peer],
                                    group=self.group, tag=tag))
            recv_bytes += nbytes
        for peer, address, nbytes, tag in sends:
            works.append(dist.isend(_bytes_at(address, nbytes), dst=self._global[peer],
                                    group=self.group, tag=tag))
        return _Exchange(works, recv_bytes)

    def all_gather(self, mine, nbytes, out):
        self.all_gather_v(mine, [nbytes] * self._size, out)

    def all_gather_v(self, mine, counts, out):
        # gloo gathers equal sizes: pad to the largest, then keep each rank's part.
        width = max(max(counts), 1)
        send = torch.zeros(width, dtype=torch.uint8)
        send[:counts[self._rank]] = _bytes_at(mine, counts[self._rank])
        parts = [torch.empty(width, dtype=torch.uint8) for _ in range(self._size)]
        _collective(dist.all_gather, parts, send, group=self.group)
        dest = _bytes_at(out, sum(counts))
        offset = 0
        for part, n in zip(parts, counts):
            dest[offset:offset + n] = part[:n]
            offset += n

    def barrier(self):
        dist.barrier(group=self.group)

    def abort(self, code):
        os._exit(code)


class DistAttention:
    """Attention over `mask` spread over the ranks of a torch.distributed group (the default group
    if None). Planning happens once per mask (per dtype); any number of layers share the object,
    each call's backward getting its context from autograd.

        attn = flexcp.DistAttention(mask, heads_q=Hq, heads_kv=Hk, head_dim=D)
        x_local = attn.dispatch(x_global)       # this rank's rows, in local order
        out, lse = attn(q_local, k_local, v_local)
        y_global = attn.undispatch(out)         # collective

    CPU tensors over a gloo group. CUDA tensors (each rank's on its current device) over an NCCL
    group run through flexcp's own NCCL communicator, its unique id sent over a gloo group (made
    here for the default group; pass `host_group`, a gloo group of the same ranks, with an NCCL
    subgroup); over a gloo group, through the staged backend (device buffers through host memory:
    for ranks sharing a GPU, a test path, not a fast one). Calls are ordered on torch's current
    CUDA stream.

    A packed batch's mask changes every step: `attn.replan(next_mask)` plans it over the same
    communicators (made once, at the first call on each device).

    With keep_stats=True the object keeps the last call's context (its K/V columns stay allocated
    until the next call), so that last_stats() can say what it moved and where it waited.
    """

    def __init__(self, mask, heads_q, heads_kv, head_dim, group=None, chunk_size=0,
                 chunks_per_rank=0, host_group=None, keep_stats=False):
        if not isinstance(mask, Mask):
            raise ValueError(f"flexcp.DistAttention: mask must be a flexcp.Mask, "
                             f"got {type(mask).__name__}")
        if not dist.is_initialized():
            raise RuntimeError("flexcp.DistAttention: torch.distributed is not initialised "
                               "(torch.distributed.init_process_group first)")
        fn = "flexcp.DistAttention"
        self.heads_q, self.heads_kv, self.head_dim = (
            integer(fn, "heads_q", heads_q), integer(fn, "heads_kv", heads_kv),
            integer(fn, "head_dim", head_dim))
        self.group = group
        self._group_on_nccl = "nccl" in str(dist.get_backend(group)).lower()
        self._host_group = _host_group_for(group, host_group, self._group_on_nccl)
        self._plan_args = (integer(fn, "chunk_size", chunk_size),
                           integer(fn, "chunks_per_rank", chunks_per_rank))
        self._keep_stats = bool(keep_stats)
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        # The group's communicators, one set per device, shared with every replan() of this.
        self._comms = {}
        self._plan_mask(mask)

    def _plan_mask(self, mask):
        """What belongs to the mask: its plans (one per dtype and device, made on first use) and
        the dispatch."""
        self.mask = mask
        self._impls = {}
        self._rolls = {}
        self._last_context = None
        # The dispatch is the same for every dtype: plan once to know it.
        first = self._impl_for(torch.float32)
        self.position_ids = torch.tensor(first.position_ids(), dtype=torch.int64)
        self.kv_token_ids = torch.tensor(first.kv_token_ids(), dtype=torch.int64)
        self._token_rank = torch.tensor(first.token_ranks(), dtype=torch.int64)
        self._token_row = torch.tensor(first.token_local_rows(), dtype=torch.int64)

    def replan(self, mask):
        """A DistAttention for another mask (of any length) over the same group, sizes and
        options, sharing this one's communicators: a packed batch's documents change every step,
        and making communicators (an NCCL communicator, a gloo group) does not belong in a step.
        Collective, like the constructor; both objects stay usable, in the same order on every
        rank."""
        if not isinstance(mask, Mask):
            raise ValueError(f"flexcp.DistAttention.replan: mask must be a flexcp.Mask, "
                             f"got {type(mask).__name__}")
        other = copy.copy(self)  # the group, sizes, options and the communicators' dict
        other._plan_mask(mask)
        return other

    def _impl_for(self, dtype, device=torch.device("cpu")):
        """The C++ object for one dtype on one device (planned on first use, collectively: every
        rank's first call with that dtype and device type comes in the same order)."""
        if dtype not in _DTYPES:
            raise ValueError(f"flexcp.DistAttention: dtype {dtype}, expected float32, bfloat16 "
                             "or float16")
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"flexcp.DistAttention: tensors on {device}, expected cpu or cuda")
        index = 0
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
        key = (dtype, device.type, index)
        if key not in self._impls:
            if (device.type, index) not in self._comms:
                backend = "" if device.type == "cpu" else \
                    "nccl" if self._group_on_nccl else "staged"
                self._comms[(device.type, index)] = _flexcp.DistComm(
                    _GroupComm(self._host_group), device.type, index, backend)
            self._impls[key] = _flexcp.DistAttention(
                self.mask._mask, self._comms[(device.type, index)], self.heads_q, self.heads_kv,
                self.head_dim, _DTYPES[dtype], *self._plan_args, device=device.type,
                device_index=index)
        return self._impls[key]

    def __call__(self, q, k, v, scale=None, softcap=0.0, sink=None):
        """out [T_local, Hq, D] and lse [T_local, Hq] of this rank's rows; differentiable in q, k,
        v and sink. Collective: every rank calls it, in the same order, with the same options.
        q, k, v (and the output gradient) are made contiguous first if they are not (a copy).
        Tensors (and the sink) on one device: the CPU, or this rank's GPU."""
        for name, t in (("q", q), ("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"flexcp.DistAttention: {name} must be a torch.Tensor")
        fn = "flexcp.DistAttention"
        return _DistForward.apply(self, q, k, v, scale_option(fn, scale),
                                  real_number(fn, "softcap", softcap), sink)

    def last_stats(self):
        """What the last call on this rank moved and how long it took, as a dict: bytes
        (fwd_bytes_received, fwd_bytes_sent, bwd_bytes_received, bwd_bytes_sent), per stage
        (stage 0 first) a (wait, compute) pair in ms for the forward (the wait for that stage's
        K/V) and the backward (stage 0's wait: for the dK/dV partials of this rank's rows), and
        forward_ms and backward_ms (0 until its backward ran). Device time on CUDA tensors (this
        waits for the work), host time on CPU tensors. None before the first call. Needs
        keep_stats=True."""
        if not self._keep_stats:
            raise ValueError("flexcp.DistAttention.last_stats: the object was made with "
                             "keep_stats=False; pass keep_stats=True to keep the last call's "
                             "context")
        return None if self._last_context is None else self._last_context.stats()

    # Rows of the global sequence <-> this rank's rows.

    def dispatch(self, x_global):
        """This rank's rows of a global [T, ...] tensor (the same on every rank), in local order.
        No communication; the gradient scatters back into this rank's rows."""
        return _Dispatch.apply(x_global, self.position_ids.to(x_global.device))

    def dispatch_kv(self, x_global):
        """The K/V rows this rank holds (the same rows as dispatch for self-attention)."""
        return _Dispatch.apply(x_global, self.kv_token_ids.to(x_global.device))

    def undispatch(self, x_local):
        """Every rank's rows back into the global [T, ...] tensor, on every rank (collective). The
        gradient is the sum over ranks of each rank's gradient, as for an all-gather."""
        return _Undispatch.apply(self, x_local)

    def roll(self, x_local, shift, within_documents=False, fill=0):
        """dispatch(torch.roll(undispatch(x_local), shift, 0)) for any trailing shape, moving only
        the rows whose source is on another rank. With within_documents, a position whose source
        lies in another document, or wraps around the sequence, gets `fill` (next-token and
        multi-token-prediction labels). Differentiable: the gradient rolls back by -shift."""
        shift = integer("flexcp.DistAttention.roll", "shift", shift)
        return _Roll.apply(self, x_local, shift, bool(within_documents), fill)

    # The exchange a roll makes, planned once per (shift, within_documents).

    def _roll_plan(self, shift, within_documents):
        key = (shift, within_documents)
        if key in self._rolls:
            return self._rolls[key]
        t = self.mask.seqlen_q
        pos = self.position_ids
        src = pos - shift
        valid = torch.ones_like(pos, dtype=torch.bool)
        if within_documents:
            doc = self.mask.document_ids()
            valid = (src >= 0) & (src < t)
            src_c = src.clamp(0, t - 1)
            valid &= doc[src_c] == doc[pos]
        src = src.remainder(t)
        src_rank = self._token_rank[src]
        src_row = self._token_row[src]
        # What every rank needs from every other: each rank computes all of it from the dispatch.
        every_pos = [self._positions_of(r) for r in range(self.world_size)]
        plan = {"valid": valid, "local": [], "recv": {}, "send": {}}
        mine = (src_rank == self.rank) & valid
        plan["local"] = (torch.nonzero(mine).flatten(), src_row[mine])
        for r in range(self.world_size):
            if r == self.rank:
                continue
            want = (src_rank == r) & valid
            plan["recv"][r] = (torch.nonzero(want).flatten(), None)
            # Rows of mine that rank r needs, in r's order.
            r_src = every_pos[r] - shift
            r_valid = torch.ones_like(r_src, dtype=torch.bool)
            if within_documents:
                doc = self.mask.document_ids()
                r_valid = (r_src >= 0) & (r_src < t)
                r_valid &= doc[r_src.clamp(0, t - 1)] == doc[every_pos[r]]
            r_src = r_src.remainder(t)
            needs = (self._token_rank[r_src] == self.rank) & r_valid
            plan["send"][r] = self._token_row[r_src[needs]]
        self._rolls[key] = plan
        return plan

    def _positions_of(self, rank):
        return torch.nonzero(self._token_rank == rank).flatten()


def _host_group_for(group, host_group, on_nccl):
    """The gloo group flexcp's host messages go over (the group itself unless it is NCCL's)."""
    if host_group is not None:
        if dist.get_rank(host_group) < 0:
            raise ValueError("flexcp.DistAttention: this rank is not in host_group; expected a "
                             "gloo group of the same ranks as the group")
        if dist.get_world_size(host_group) != dist.get_world_size(group):
            raise ValueError("flexcp.DistAttention: host_group has "
                             f"{dist.get_world_size(host_group)} ranks, the group "
                             f"{dist.get_world_size(group)}; expected a gloo group of the same "
                             "ranks")
        return host_group
    if not on_nccl:
        return group
    if group is not None and dist.get_world_size(group) != dist.get_world_size():
        # Making a group is collective over the default group: a subgroup's ranks alone cannot.
        raise ValueError("flexcp.DistAttention: the group is an NCCL subgroup; pass host_group, a "
                         "gloo group of the same ranks (torch.distributed.new_group(ranks, "
                         "backend='gloo'), made on every rank)")
    ranks = list(range(dist.get_world_size())) if group is None else \
        [dist.get_global_rank(group, r) for r in range(dist.get_world_size(group))]
    return dist.new_group(ranks, backend="gloo")


class _DistForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, attn, q, k, v, scale, softcap, sink):
        impl = attn._impl_for(q.dtype, q.device)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
        qc, kc, vc = (t.detach().contiguous() for t in (q, k, v))
        context = impl.forward(qc, kc, vc, out, lse, scale, softcap,
                               None if sink is None else sink.detach().contiguous(),
                               _stream_of(q))
        ctx.impl, ctx.context, ctx.has_sink = impl, context, sink is not None
        if attn._keep_stats:
            attn._last_context = context
        ctx.kv_shape = k.shape
        ctx.save_for_backward(qc, out, lse)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, out, lse = ctx.saved_tensors
        # The C++ backward runs on its forward's stream (autograd calls this on that one too).
        dq = torch.empty_like(q)
        dk = torch.empty(ctx.kv_shape, dtype=q.dtype, device=q.device)
        dv = torch.empty(ctx.kv_shape, dtype=q.dtype, device=q.device)
        dsink = torch.empty(q.shape[1], dtype=torch.float32, device=q.device) \
            if ctx.has_sink else None
        ctx.impl.backward(ctx.context, dout.contiguous(), q, out, lse, dq, dk, dv, dsink)
        return None, dq, dk, dv, None, None, dsink


def _stream_of(t):
    """torch's current CUDA stream on t's device, as the integer the C++ side takes (0: CPU)."""
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


class _Dispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_global, rows):
        ctx.save_for_backward(rows)
        ctx.global_shape = x_global.shape
        return x_global.index_select(0, rows)

    @staticmethod
    def backward(ctx, grad):
        (rows,) = ctx.saved_tensors
        out = grad.new_zeros(ctx.global_shape)
        out.index_copy_(0, rows, grad)
        return out, None


def _for_collectives(attn, x):
    """The group to exchange x over and x as that group takes it: CUDA tensors over an NCCL group
    as they are; anything else over the gloo group, in host memory."""
    if x.is_cuda and attn._group_on_nccl:
        return attn.group, x
    return attn._host_group, x.cpu()


def _gather_rows(attn, x_local):
    """All ranks' local rows into the global tensor (positions from the dispatch)."""
    device = x_local.device
    group, x_local = _for_collectives(attn, x_local)
    counts = [int((attn._token_rank == r).sum()) for r in range(attn.world_size)]
    width = max(counts)
    padded = x_local.new_zeros((width, *x_local.shape[1:]))
    padded[:x_local.shape[0]] = x_local
    parts = [torch.empty_like(padded) for _ in range(attn.world_size)]
    padded = padded.contiguous()
    _collective(dist.all_gather, parts, padded, group=group)
    out = x_local.new_empty((attn.mask.seqlen_q, *x_local.shape[1:]))
    for r, (part, n) in enumerate(zip(parts, counts)):
        out.index_copy_(0, attn._positions_of(r).to(out.device), part[:n])
    return out.to(device)


class _Undispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, attn, x_local):
        ctx.attn = attn
        return _gather_rows(attn, x_local.detach())

    @staticmethod
    def backward(ctx, grad):
        group, summed = _for_collectives(ctx.attn, grad.contiguous().clone())
        _collective(dist.all_reduce, summed, group=group)
        rows = ctx.attn.position_ids.to(summed.device)
        return None, summed.index_select(0, rows).to(grad.device)


def _roll_rows(attn, x_local, shift, within_documents, fill):
    device = x_local.device
    group, x_local = _for_collectives(attn, x_local)
    plan = attn._roll_plan(shift, within_documents)
    peer = (lambda r: dist.get_global_rank(group, r)) if group is not None else (lambda r: r)
    out = torch.full_like(x_local, fill) if within_documents else torch.empty_like(x_local)
    rows, src = plan["local"]
    out[rows.to(out.device)] = x_local[src.to(x_local.device)]
    works, buffers = [], {}
    for r, send_rows in plan["send"].items():
        if send_rows.numel():
            works.append(dist.isend(x_local[send_rows.to(x_local.device)].contiguous(),
                                    dst=peer(r), group=group))
    for r, (recv_rows, _) in plan["recv"].items():
        if recv_rows.numel():
            buffers[r] = x_local.new_empty((recv_rows.numel(), *x_local.shape[1:]))
            works.append(dist.irecv(buffers[r], src=peer(r), group=group))
    for w in works:
        w.wait()
    for r, buf in buffers.items():
        out[plan["recv"][r][0].to(out.device)] = buf
    return out.to(device)


class _Roll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, attn, x_local, shift, within_documents, fill):
        ctx.attn, ctx.shift, ctx.within = attn, shift, within_documents
        return _roll_rows(attn, x_local.detach(), shift, within_documents, fill)

    @staticmethod
    def backward(ctx, grad):
        return None, _roll_rows(ctx.attn, grad.contiguous(), -ctx.shift, ctx.within, 0), None, \
            None, None
