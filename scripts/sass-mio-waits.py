"""Finds, in a kernel's SASS, shared-memory and shuffle instructions issued behind a warp group's
wgmmas whose registers the code touches soon after: a likely stall on the warp's way to its next
product.

Why: loads, stores and shuffles go into the same in-order queue as the `HGMMA`s before them, and
leave it only when the tensor cores take those products; they read their source registers and
write their results only then. An instruction that overwrites one of their registers (the
compiler reusing an address register), reads their result, or fences memory waits that long.
One such `MOV` held the backward's consumer groups ~11% of their time before dP^T's issue
(bench/results/h100-2026-12-05.md section 10); Nsight Compute shows these as short-scoreboard
(or, at a fence, long-scoreboard) stalls.

    cuobjdump --dump-sass OBJ | python3 scripts/sass-mio-waits.py [--window N] [--reach N]

Prints each waiting instruction with its kernel, how many queued instructions it waits on, and
how far after the last `HGMMA` the first of them sits (--reach: how far still counts, default
48). No GPU needed (scripts/cuobjdump.sh sets `cuobjdump`, fetching one if the toolkit has none).
"""
import re
import sys

MIO = re.compile(r"^(LDS|STS|STSM|LDSM|SHFL|ATOMS)\b")


def registers(text):
    """The registers (uniform or not) an operand list names; a vector operand's further registers
    (R16 of an LDS.64 also writes R17) are not listed, which can miss a hit but not invent one."""
    regs = set()
    for m in re.finditer(r"\b(U?R)(\d+)\b", text):
        regs.add(m.group(1) + m.group(2))
    return regs


def drains(op, text):
    """Whether the warp waits here for all of its products (a wait that leaves groups pending,
    `gsb0, 0x1`, leaves their wgmmas queued) or leaves."""
    if op.startswith("WARPGROUP.DEPBAR"):
        return text.rstrip().endswith("0x0")
    return op.startswith(("EXIT", "RET"))


def ends_scan(op, text):
    """Where a look ahead stops: the queue drained, a wait for other warps (the queued work
    finishes meanwhile), or a jump (the next instruction in the listing may not run next)."""
    unconditional_jump = op.startswith(("BRA", "JMP")) and not text.startswith("@")
    return drains(op, text) or op.startswith("BAR.SYNC") or unconditional_jump


def parse(lines):
    """(address, opcode, text, registers written, registers read) per instruction, and a
    ("name", "FUNCTION", ...) row where each kernel starts."""
    code = []
    for line in lines:
        f = re.match(r"\s*Function : (\S+)", line)
        if f:
            code.append((f.group(1), "FUNCTION", "", set(), set()))
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if not m:
            continue
        guard = re.match(r"^@!?U?P\w+\s+", m.group(2))
        body = m.group(2)[guard.end():] if guard else m.group(2)
        op = body.split()[0] if body else ""
        operands = body[len(op):].strip()
        parts = [p.strip() for p in operands.split(",")]
        # Stores write memory, not registers: every operand is a source.
        stores = op.startswith(("STS", "STSM", "RED"))
        # A predicate written first (SHFL's PT) comes before the register destination.
        lead = 2 if parts and re.fullmatch(r"U?P(T|\d+)", parts[0]) else 1
        dst = set() if stores or not parts else registers(",".join(parts[:lead]))
        src = registers(operands) if stores else registers(",".join(parts[lead:]))
        code.append((m.group(1), op, m.group(2), dst - {"RZ", "URZ"}, src - {"RZ", "URZ"}))
    return code


def option(name, default):
    return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


def main():
    window = option("--window", 24)  # how far after a queued instruction to look for its waiter
    reach = option("--reach", 48)  # how far after an HGMMA an instruction counts as behind it
    code = parse(sys.stdin.readlines())
    waiters = {}  # the waiting instruction's index: [kind, queued instructions, distance]
    function = {}  # each instruction's kernel
    name, last_hgmma = "?", None
    for i, (addr, op, text, dst, src) in enumerate(code):
        if op == "FUNCTION":
            name, last_hgmma = addr, None
            continue
        function[i] = name
        if op.startswith("HGMMA"):
            last_hgmma = i
        elif drains(op, text):
            last_hgmma = None
        if last_hgmma is None or i - last_hgmma > reach or not MIO.match(op):
            continue
        for j in range(i + 1, min(i + 1 + window, len(code))):
            _, op2, text2, dst2, src2 = code[j]
            if op2 == "FUNCTION" or ends_scan(op2, text2):
                break
            war, raw = dst2 & (src | dst), src2 & dst
            fence = op2.startswith(("MEMBAR", "FENCE"))  # waits for every store before it
            if war or raw or fence:
                kind = ("waits (a fence) for" if fence else
                        "overwrites a register of" if war else "reads the result of")
                entry = waiters.setdefault(j, [kind, [], i - last_hgmma])
                entry[1].append(f"{addr}: {text}")
                break
    for j, (kind, queued, distance) in sorted(waiters.items()):
        print(f"{function[j]}\n  {code[j][0]}: {code[j][2]}\n    {kind} {len(queued)} queued,"
              f" the first {distance} instructions after an HGMMA: {queued[0]}")
    print(f"{len(waiters)} instruction(s) wait on shared-memory or shuffle instructions queued"
          " behind wgmmas")
    return 0


if __name__ == "__main__":
    sys.exit(main())
