"""FlashAttention-4's sm90 forward with phase clocks, to lay its two consumer groups' blocks beside
flexcp's (the `fwd-timeline` of scripts/gpu-phases.sh, h200-timeline-2026-12-04.md).

FA4 keeps no clocks of its own, so this loads a copy of its `flash_fwd_sm90.py` with six clock
reads added to the steady block (`mma_one_n_block_intrawg_overlap`, the only block FA4 runs
unmasked at head dim 128): the block's start, K waited for, the turn's barrier passed, the turn
handed over (S and P V issued), S landed, and the block's end. Each read is one piece of inline
PTX that reads %clock64 and, in thread 0 of each warp group of CTA (0, 0, 0) for the key blocks
[LO, LO + 16), stores it to a buffer whose address is built into the kernel: the same
once-a-block cost as flexcp's own phase clocks. FA4 walks its key blocks from the last one down,
so blocks 191..176 of a 32K full forward are its 65th to 80th, flexcp's timeline's blocks 64-79.
The traced and untraced kernels are timed back to back, so the trace's cost shows.

    python3 bench/fa4_phase_trace.py OUT [--seqlen 32768] [--heads 64] [--heads-kv 8]
    python3 bench/fa4_phase_trace.py --compile-only DUMP_DIR   (no GPU: the PTX, to check the edit)

On the GPU host FA4 comes from FA4_SITE (scripts/gpu-fa4.sh) on PYTHONPATH. Prints and writes
OUT/fa4-timeline.txt: per block, each group's phase ends in cycles from group 0's start of the
block, then each phase's mean length per group and the block period.
"""
import argparse
import importlib.util
import os
import sys
import tempfile

LO, BLOCKS, SLOTS = 176, 16, 6
# Each phase ends at a clock read; "softmax" runs from S landed to the block's end (the row
# maxima, the wait for P V, the exponentials, the rescale of O and P's conversion).
PHASES = ["loads", "barrier", "turn", "wait-s", "softmax"]

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

# (line in the steady block, slot of the clock read after it); slot 0 goes before the first line
# and the last slot before the return. ptxas keeps every instruction on its side of a clock read,
# so there is none inside the softmax: a read after the row maxima or after the wait for P V
# would pin the exponentials that ptxas moves below that wait (checked in the SASS: 10 before it
# and 56 after, as untraced).
AFTER = [
    ("pipeline_k.consumer_wait(smem_pipe_read, pipeline_k.consumer_try_wait(smem_pipe_read))", 1),
    ("self.warp_scheduler_barrier_sync()", 2),
    ("self.warp_scheduler_barrier_arrive()", 3),
    ("warpgroup.wait_group(1)", 4),
]


def instrument(src):
    """FA4's flash_fwd_sm90.py source with the clock reads; fails loudly if FA4's code moved."""
    start = src.index("    def mma_one_n_block_intrawg_overlap(")
    end = src.index("\n    @cute.jit", start)
    body = src[start:end]
    first = "        smem_pipe_read_v = smem_pipe_read.clone()\n"
    last = "        return smem_pipe_read\n"
    for anchor in [first, last] + [f"        {line}\n" for line, _ in AFTER]:
        if body.count(anchor) != 1:
            sys.exit(f"fa4_phase_trace: FA4's steady block has {body.count(anchor)} of "
                     f"{anchor.strip()!r}, expected 1 (another FA4 version?)")
    body = body.replace(first, "        _fx_stamp(n_block, 0)\n" + first)
    body = body.replace(last, f"        _fx_stamp(n_block, {SLOTS - 1})\n" + last)
    for line, slot in AFTER:
        stamp = f"        _fx_stamp(n_block, {slot})\n"
        body = body.replace(f"        {line}\n", f"        {line}\n{stamp}")
    ptx = STAMP_PTX
    for name, value in ("@LO@", LO), ("@BLOCKS@", BLOCKS), ("@SLOTS@", SLOTS):
        ptx = ptx.replace(name, str(value))
    anchor = "from flash_attn.cute.flash_fwd import FlashAttentionForwardBase\n"
    if src.count(anchor) != 1:
        sys.exit("fa4_phase_trace: FA4's flash_fwd_sm90.py imports changed (another FA4 version?)")
    head = src[:start].replace(anchor, anchor + STAMP_DEF.format(ptx=ptx))
    return head + body + src[end:]


def load_traced(workdir):
    """Imports the instrumented copy and points FA4's entry point at its forward class."""
    import flash_attn.cute.flash_fwd_sm90 as original
    from flash_attn.cute import interface

    path = os.path.join(workdir, "flash_fwd_sm90_traced.py")
    with open(original.__file__) as f:
        src = instrument(f.read())
    with open(path, "w") as f:  # the DSL reads a kernel's source back from its file
        f.write(src)
    spec = importlib.util.spec_from_file_location("flash_attn.cute.flash_fwd_sm90_traced", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    interface.FlashAttentionForwardSm90 = mod.FlashAttentionForwardSm90
    interface._flash_attn_fwd.compile_cache.clear()  # the untraced kernel compiled before


def compile_only(dump):
    """No GPU: compile the traced forward for sm_90a under fake tensors and keep its PTX."""
    os.environ.setdefault("FLASH_ATTENTION_ARCH", "sm_90")
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    os.environ.setdefault("FLASH_ATTENTION_NUM_SMS", "132")
    os.environ["CUTE_DSL_KEEP_PTX"] = "1"
    os.environ["CUTE_DSL_DUMP_DIR"] = dump
    os.environ["FLEXCP_FA4_TRACE_ADDR"] = "0x7f0000000000"
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    with tempfile.TemporaryDirectory() as workdir:
        load_traced(workdir)
        from flash_attn.cute import interface

        with FakeTensorMode(allow_non_fake_inputs=True):
            make = lambda h: torch.empty(1, 4096, h, 128, dtype=torch.bfloat16, device="cuda")
            interface._flash_attn_fwd(make(64), make(8), make(8), causal=False)


def timed(fn, calls=20):
    import torch

    fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / calls


def report(stamps):
    """stamps[group][block][slot] (clock64) -> the timeline's lines."""
    lines = ["fa4-timeline: cycles from group 0's start of each block (FA4 walks blocks downward)",
             "block group " + " ".join(f"{p:>8}" for p in ["start"] + PHASES)]
    lengths = {g: [[] for _ in PHASES] for g in (1, 2)}
    periods = []
    for b in range(BLOCKS - 1, -1, -1):
        base = stamps[1][b][0]
        for g in (1, 2):
            row = [stamps[g][b][s] - base for s in range(SLOTS)]
            lines.append(f"{LO + b:5d} {g - 1:5d} " + " ".join(f"{v:8d}" for v in row))
            for s in range(1, SLOTS):
                lengths[g][s - 1].append(stamps[g][b][s] - stamps[g][b][s - 1])
        if b > 0:
            periods.append(stamps[1][b - 1][0] - base)
    lines.append("fa4-phases: mean cycles per block (group 0 / group 1)")
    for i, p in enumerate(PHASES):
        m = [sum(lengths[g][i]) / len(lengths[g][i]) for g in (1, 2)]
        lines.append(f"  {p:>8}: {m[0]:7.0f} / {m[1]:7.0f}")
    lines.append(f"  period (group 0's start to its next): {sum(periods) / len(periods):.0f}")
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?")
    ap.add_argument("--compile-only", metavar="DUMP_DIR")
    ap.add_argument("--seqlen", type=int, default=32768)
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--heads-kv", type=int, default=8)
    a = ap.parse_args()
    if a.compile_only:
        return compile_only(a.compile_only)
    if not a.out:
        ap.error("OUT is needed (or --compile-only DUMP_DIR)")
    if a.seqlen < 128 * (LO + BLOCKS):
        ap.error(f"--seqlen {a.seqlen}: the traced key blocks end at {128 * (LO + BLOCKS)} tokens")
    import torch
    from flash_attn.cute import interface

    os.makedirs(a.out, exist_ok=True)
    buf = torch.zeros(3 * BLOCKS * SLOTS, dtype=torch.int64, device="cuda")
    os.environ["FLEXCP_FA4_TRACE_ADDR"] = str(buf.data_ptr())
    torch.manual_seed(0)
    shape = lambda h: (1, a.seqlen, h, 128)
    q = torch.randn(shape(a.heads), device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(shape(a.heads_kv), device="cuda", dtype=torch.bfloat16) for _ in range(2))
    run = lambda: interface._flash_attn_fwd(q, k, v, causal=False)
    flops = 4 * a.seqlen * a.seqlen * a.heads * 128
    plain_ms = timed(run)
    with tempfile.TemporaryDirectory() as workdir:
        load_traced(workdir)
        traced_ms = timed(run)
    stamps = buf.view(3, BLOCKS, SLOTS).tolist()
    if any(stamps[g][b][s] == 0 for g in (1, 2) for b in range(BLOCKS) for s in range(SLOTS)):
        sys.exit("fa4_phase_trace: some clock reads were not stored (FA4 took another path?)")
    lines = [f"FA4 forward, {a.seqlen} tokens, {a.heads}:{a.heads_kv} heads, hd128, bf16, "
             f"full: untraced {flops / plain_ms / 1e9:.1f} TFLOPS, "
             f"traced {flops / traced_ms / 1e9:.1f}"] + report(stamps)
    text = "\n".join(lines) + "\n"
    print(text, end="")
    with open(os.path.join(a.out, "fa4-timeline.txt"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
