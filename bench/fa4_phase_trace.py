"""FlashAttention-4's sm90 kernels with phase clocks, to lay their two consumer groups' blocks
beside flexcp's (the `fwd-timeline` and `bwd-timeline` of scripts/gpu-phases.sh,
h200-timeline-2026-12-04.md).

FA4 keeps no clocks of its own, so this loads a copy of the kernel's module with six clock reads
added to its steady block (KERNELS below says where): in the forward (`flash_fwd_sm90.py`,
`mma_one_n_block_intrawg_overlap`, the only block FA4 runs unmasked at head dim 128) the block's
start, K waited for, the turn's barrier passed, the turn handed over (S and P V issued), S landed
and the block's end; in the backward (`flash_bwd_sm90.py`, `mma_one_m_block`) the block's start,
S landed, both groups' dS shared, the dQ staging free, dQ staged, and the end. Each read is one
piece of inline PTX that reads %clock64 and, in thread 0 of each warp group of CTA (0, 0, 0) for
16 blocks, stores it to a buffer whose address is built into the kernel: the same once-a-block
cost as flexcp's own phase clocks. The blocks are the 65th to 80th the CTA runs (FA4's forward
walks key blocks from the last one down: 191..176 at 32K; its backward walks q blocks up: 64..79),
as flexcp's timelines show blocks 64-79. The traced and untraced kernels are timed back to back,
so the trace's cost shows.

    python3 bench/fa4_phase_trace.py OUT [--backward] [--seqlen 32768] [--heads 64] [--heads-kv 8]
    python3 bench/fa4_phase_trace.py --compile-only DUMP_DIR [--backward]   (no GPU: the PTX)

Full mask, hd128, bf16, one sequence. On the GPU host FA4 comes from FA4_SITE
(scripts/gpu-fa4.sh) on PYTHONPATH. Prints and writes OUT/fa4-{fwd,bwd}-timeline.txt: per block,
each group's phase ends in cycles from group 0's start of the block, then each phase's mean
length per group and the block period.
"""
import argparse
import importlib.util
import os
import sys
import tempfile

BLOCKS, SLOTS = 16, 6  # blocks traced, clock reads a block

# One clock read, stored by thread 0 of each warp group of CTA (0, 0, 0) for key blocks
# [LO, LO + BLOCKS): slot @SLOT@ of (warp group, block - LO). $0 the buffer, $1 the key block.
STAMP_PTX = """{
.reg .pred fxp;
.reg .u32 fxt, fxr, fxc;
.reg .u64 fxk, fxa;
mov.u64 fxk, %clock64;
mov.u32 fxt, %tid.x;
and.b32 fxr, fxt, 127;
setp.eq.u32 fxp, fxr, 0;
mov.u32 fxc, %ctaid.x;
setp.eq.and.u32 fxp, fxc, 0, fxp;
mov.u32 fxc, %ctaid.y;
setp.eq.and.u32 fxp, fxc, 0, fxp;
mov.u32 fxc, %ctaid.z;
setp.eq.and.u32 fxp, fxc, 0, fxp;
sub.u32 fxr, $1, @LO@;
setp.lt.and.u32 fxp, fxr, @BLOCKS@, fxp;
shr.u32 fxt, fxt, 7;
mad.lo.u32 fxr, fxt, @BLOCKS@, fxr;
mad.lo.u32 fxr, fxr, @SLOTS@, @SLOT@;
mul.wide.u32 fxa, fxr, 8;
add.u64 fxa, fxa, $0;
@fxp st.global.u64 [fxa], fxk;
}"""

STAMP_DEF = '''
import os as _fx_os
from cutlass.cutlass_dsl import dsl_user_op as _fx_user_op
from cutlass._mlir.dialects import llvm as _fx_llvm

_FX_BUFFER = int(_fx_os.environ["FLEXCP_FA4_TRACE_ADDR"], 0)
_FX_PTX = {ptx!r}


@_fx_user_op
def _fx_stamp(n_block, slot, *, loc=None, ip=None):
    _fx_llvm.inline_asm(
        None,
        [
            cutlass.Int64(_FX_BUFFER).ir_value(loc=loc, ip=ip),
            Int32(n_block).ir_value(loc=loc, ip=ip),
        ],
        _FX_PTX.replace("@SLOT@", str(slot)),
        "l,r",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=_fx_llvm.AsmDialect.AD_ATT,
    )
'''


class Kernel:
    """Where one FA4 kernel's block is instrumented: its module and class, the block's method and
    the name of its block index, the clock reads as (anchor, indent, slot, before) insertions (the
    anchor is text that occurs once in the method, the read goes on its own line before or after
    it), and the phases that end at each read after the first."""

    def __init__(self, module, cls, entry, method, index, lo, step, import_line, reads, phases):
        self.module, self.cls, self.entry, self.method = module, cls, entry, method
        self.index, self.lo, self.step = index, lo, step  # blocks [lo, lo + BLOCKS), walked by step
        self.import_line, self.reads, self.phases = import_line, reads, phases


# ptxas keeps every instruction on its side of a clock read, so there is none where FA4's SASS
# moves arithmetic across a wait: in the forward, inside the softmax (a read after the row maxima
# or after the wait for P V pins the exponentials that ptxas moves below that wait; checked: 10
# before it and 56 after, as untraced); in the backward, between S landed and dS shared (ptxas
# interleaves P's exponentials, dP's wait and dS's stores).
FORWARD = Kernel(
    "flash_fwd_sm90", "FlashAttentionForwardSm90", "_flash_attn_fwd",
    "mma_one_n_block_intrawg_overlap", "n_block", 176, -1,
    "from flash_attn.cute.flash_fwd import FlashAttentionForwardBase\n",
    [
        ("smem_pipe_read_v = smem_pipe_read.clone()", 8, 0, True),
        ("pipeline_k.consumer_wait(smem_pipe_read, pipeline_k.consumer_try_wait(smem_pipe_read))",
         8, 1, False),
        ("self.warp_scheduler_barrier_sync()", 8, 2, False),
        ("self.warp_scheduler_barrier_arrive()", 8, 3, False),
        ("warpgroup.wait_group(1)", 8, 4, False),
        ("return smem_pipe_read", 8, 5, True),
    ],
    # "softmax" runs from S landed to the block's end: the row maxima, the wait for P V, the
    # exponentials, the rescale of O and P's conversion.
    ["loads", "barrier", "turn", "wait-s", "softmax"],
)
BACKWARD = Kernel(
    "flash_bwd_sm90", "FlashAttentionBackwardSm90", "_flash_attn_bwd",
    "mma_one_m_block", "m_block", 64, 1,
    "from flash_attn.cute.utils import AuxData\n",
    [
        ("consumer_state_dO_cur = (", 8, 0, True),
        ("acc_dP = mma_dov_fn(A_idx=smem_idx_Q, wg_wait=1)", 8, 1, False),
        ("cute.arch.fence_view_async_shared()\n        PdS_barrier.arrive_and_wait()", 8, 2, False),
        ("tdQrdQaccum_flat = cute.make_tensor(", 12, 3, True),
        ("warpgroup.wait_group(0)\n            pipeline_Q.consumer_release(consumer_state_Q)\n"
         "        else:", 12, 4, True),
        ("consumer_state_Q.advance()", 8, 5, True),
    ],
    # scores: Q waited for, S and dP issued, S landed; ds-shared: P, dP landed, dS stored, dV
    # issued, both groups' dS in shared memory; dq-free: dQ and dK issued, dQ landed, the dQ
    # staging free; dq-stage: dQ staged for the reductions; dk-wait: dK landed.
    ["scores", "ds-shared", "dq-free", "dq-stage", "dk-wait"],
)
KERNELS = {"fwd": FORWARD, "bwd": BACKWARD}


def instrument(src, kern):
    """The FA4 module's source with the clock reads; fails loudly if FA4's code moved."""
    start = src.index(f"    def {kern.method}(")
    end = src.index("\n    @cute.jit", start)
    body = src[start:end]
    for anchor, indent, slot, before in kern.reads:
        text = " " * indent + anchor + "\n"
        if body.count(text) != 1:
            sys.exit(f"fa4_phase_trace: FA4's {kern.method} has {body.count(text)} of "
                     f"{anchor!r}, expected 1 (another FA4 version?)")
        stamp = " " * indent + f"_fx_stamp({kern.index}, {slot})\n"
        body = body.replace(text, stamp + text if before else text + stamp)
    ptx = STAMP_PTX
    for name, value in ("@LO@", kern.lo), ("@BLOCKS@", BLOCKS), ("@SLOTS@", SLOTS):
        ptx = ptx.replace(name, str(value))
    if src.count(kern.import_line) != 1:
        sys.exit(f"fa4_phase_trace: FA4's {kern.module}.py imports changed (another FA4 version?)")
    head = src[:start].replace(kern.import_line, kern.import_line + STAMP_DEF.format(ptx=ptx))
    return head + body + src[end:]


def load_traced(workdir, kern):
    """Imports the instrumented copy and points FA4's entry point at its kernel class."""
    from flash_attn.cute import interface

    original = importlib.import_module(f"flash_attn.cute.{kern.module}")
    path = os.path.join(workdir, f"{kern.module}_traced.py")
    with open(original.__file__) as f:
        src = instrument(f.read(), kern)
    with open(path, "w") as f:  # the DSL reads a kernel's source back from its file
        f.write(src)
    name = f"flash_attn.cute.{kern.module}_traced"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    setattr(interface, kern.cls, getattr(mod, kern.cls))
    getattr(interface, kern.entry).compile_cache.clear()  # the untraced kernel compiled before


def problem(seqlen, heads, heads_kv, device):
    """Q, K and V in FA4's layout, (B, T, H, D)."""
    import torch

    shape = lambda h: (1, seqlen, h, 128)
    make = lambda h: torch.randn(shape(h), device=device, dtype=torch.bfloat16)
    q, k, v = make(heads), make(heads_kv), make(heads_kv)
    return q, k, v


def compile_only(dump, kern):
    """No GPU: compile the traced kernel for sm_90a under fake tensors and keep its PTX."""
    os.environ.setdefault("FLASH_ATTENTION_ARCH", "sm_90")
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    os.environ.setdefault("FLASH_ATTENTION_NUM_SMS", "132")
    os.environ["CUTE_DSL_KEEP_PTX"] = "1"
    os.environ["CUTE_DSL_DUMP_DIR"] = dump
    os.environ["FLEXCP_FA4_TRACE_ADDR"] = "0x7f0000000000"
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    with tempfile.TemporaryDirectory() as workdir:
        load_traced(workdir, kern)
        from flash_attn.cute import interface

        with FakeTensorMode(allow_non_fake_inputs=True):
            empty = lambda h: torch.empty(1, 4096, h, 128, dtype=torch.bfloat16, device="cuda")
            q, k, v = empty(64), empty(8), empty(8)
            if kern is FORWARD:
                interface._flash_attn_fwd(q, k, v, causal=False)
            else:
                lse = torch.empty(1, 64, 4096, dtype=torch.float32, device="cuda")
                interface._flash_attn_bwd(q, k, v, empty(64), empty(64), lse, causal=False)


def timed(fn, calls=20):
    """Milliseconds a call, and the SM clock meanwhile (MHz, NVML; 0 where it cannot be read): the
    cycles of the timeline convert to time only at the clock the kernel ran at, which the power
    cap lowers more for a denser kernel (bench/results/h100-2026-12-05.md section 3)."""
    import torch
    from gpu_clocks import ClockSampler

    fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with ClockSampler() as clocks:
        start.record()
        for _ in range(calls):
            fn()
        stop.record()
        torch.cuda.synchronize()
    return start.elapsed_time(stop) / calls, clocks.summary(busy_only=True).get("mhz", 0)


def report(stamps, kern, name):
    """stamps[warp group][block - lo][slot] (clock64) -> the timeline's lines."""
    lines = [f"{name}: cycles from group 0's start of each block, in the order FA4 runs them",
             "block group " + " ".join(f"{p:>9}" for p in ["start"] + kern.phases)]
    lengths = {g: [[] for _ in kern.phases] for g in (1, 2)}
    order = list(range(BLOCKS)) if kern.step > 0 else list(range(BLOCKS - 1, -1, -1))
    periods = []
    for i, b in enumerate(order):
        base = stamps[1][b][0]
        for g in (1, 2):
            row = [stamps[g][b][s] - base for s in range(SLOTS)]
            lines.append(f"{kern.lo + b:5d} {g - 1:5d} " + " ".join(f"{v:9d}" for v in row))
            for s in range(1, SLOTS):
                lengths[g][s - 1].append(stamps[g][b][s] - stamps[g][b][s - 1])
        if i + 1 < len(order):
            periods.append(stamps[1][order[i + 1]][0] - base)
    lines.append(f"{name}: mean cycles a block, group 0 / group 1")
    for i, p in enumerate(kern.phases):
        m = [sum(lengths[g][i]) / len(lengths[g][i]) for g in (1, 2)]
        lines.append(f"  {p:>9}: {m[0]:7.0f} / {m[1]:7.0f}")
    lines.append(f"  period (group 0's start to its next): {sum(periods) / len(periods):.0f}")
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?")
    ap.add_argument("--compile-only", metavar="DUMP_DIR")
    ap.add_argument("--backward", action="store_true", help="trace the backward, not the forward")
    ap.add_argument("--seqlen", type=int, default=32768)
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--heads-kv", type=int, default=8)
    a = ap.parse_args()
    kern = BACKWARD if a.backward else FORWARD
    direction = "bwd" if a.backward else "fwd"
    if a.compile_only:
        return compile_only(a.compile_only, kern)
    if not a.out:
        ap.error("OUT is needed (or --compile-only DUMP_DIR)")
    if a.seqlen < 128 * (kern.lo + BLOCKS):
        ap.error(f"--seqlen {a.seqlen}: the traced blocks need {128 * (kern.lo + BLOCKS)} tokens")
    import torch
    from flash_attn.cute import interface

    os.makedirs(a.out, exist_ok=True)
    buf = torch.zeros(3 * BLOCKS * SLOTS, dtype=torch.int64, device="cuda")
    os.environ["FLEXCP_FA4_TRACE_ADDR"] = str(buf.data_ptr())
    torch.manual_seed(0)
    q, k, v = problem(a.seqlen, a.heads, a.heads_kv, "cuda")
    flops = 4 * a.seqlen * a.seqlen * a.heads * 128
    if a.backward:
        # lse is kept only when asked for (or when an input requires grad).
        out, lse = interface._flash_attn_fwd(q, k, v, causal=False, return_lse=True)[:2]
        dout = torch.randn_like(out)
        run = lambda: interface._flash_attn_bwd(q, k, v, out, dout, lse, causal=False)
        flops *= 2.5  # five products of the forward's two's size
    else:
        run = lambda: interface._flash_attn_fwd(q, k, v, causal=False)
    plain_ms, plain_mhz = timed(run)
    with tempfile.TemporaryDirectory() as workdir:
        load_traced(workdir, kern)
        traced_ms, traced_mhz = timed(run)
    stamps = buf.view(3, BLOCKS, SLOTS).tolist()
    if any(stamps[g][b][s] == 0 for g in (1, 2) for b in range(BLOCKS) for s in range(SLOTS)):
        sys.exit("fa4_phase_trace: some clock reads were not stored (FA4 took another path?)")
    name = f"fa4-{direction}-timeline"
    lines = [f"FA4 {'backward' if a.backward else 'forward'}, {a.seqlen} tokens, "
             f"{a.heads}:{a.heads_kv} heads, hd128, bf16, full: untraced "
             f"{flops / plain_ms / 1e9:.1f} TFLOPS at {plain_mhz:.0f} MHz, traced "
             f"{flops / traced_ms / 1e9:.1f} at {traced_mhz:.0f} MHz"]
    lines += report(stamps, kern, name)
    text = "\n".join(lines) + "\n"
    print(text, end="")
    with open(os.path.join(a.out, f"{name}.txt"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
