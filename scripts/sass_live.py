#!/usr/bin/env python3
"""Where a kernel's registers go, from nvdisasm's life ranges (`nvdisasm -plr -lrm count`): the
peak count of live general registers, and for each loop that issues wgmmas (a backward branch
whose body holds HGMMA, innermost only) its length, HGMMA, MUFU.EX2 and local-memory (spill) instructions and its
peak. A kernel's register budget is spent where its peak is; the spills a budget forces show as
LDL/STL in the loops (scripts/sm90-regs.sh runs it on one instance).

    scripts/sass_live.py LISTING [--peaks N]   (--peaks: also the N highest-pressure stretches)
"""
import argparse
import re

_INSTR = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;?\s*//\s*\|\s*(\d+)\s*\|")
_LABEL = re.compile(r"^\.(L_x_\d+):")
_BRANCH = re.compile(r"\bBRA\s+(?:`\()?\.?(L_x_\d+)")


def read(path):
    """[(address, text, live GPRs)] and {label: address} of a `-plr -lrm count` listing."""
    instrs, labels, pending = [], {}, []
    with open(path) as listing:
        for line in listing:
            label = _LABEL.match(line.strip())
            if label:
                pending.append(label.group(1))
                continue
            m = _INSTR.match(line)
            if m:
                address = int(m.group(1), 16)
                for name in pending:
                    labels[name] = address
                pending = []
                instrs.append((address, m.group(2).strip(), int(m.group(3))))
    return instrs, labels


def loops(instrs, labels):
    """(first, last, body) of each innermost loop that issues wgmmas: a backward branch's span
    holding HGMMA and no shorter such span (the outer loops around it are left out)."""
    # ptxas places slow paths (a barrier wait's retry, a warp vote) after the function's last
    # unconditional EXIT, each branching back to where it was called from: not loops.
    exits = [a for a, t, _ in instrs if t == "EXIT"]
    body_end = exits[-1] if exits else instrs[-1][0]
    spans = []
    for address, text, _ in instrs:
        m = _BRANCH.search(text)
        if not m or m.group(1) not in labels or labels[m.group(1)] >= address or address > body_end:
            continue
        first = labels[m.group(1)]
        body = [i for i in instrs if first <= i[0] <= address]
        if any("HGMMA" in t for _, t, _ in body):
            spans.append((first, address, body))
    return [s for s in spans
            if not any(o is not s and s[0] <= o[0] and o[1] <= s[1] for o in spans)]


def stretches(instrs, threshold):
    """Runs of consecutive instructions at or above `threshold` live registers."""
    run = None
    for address, text, live in instrs:
        if live >= threshold:
            if run is None:
                run = [address, address, live, text]
            run[1] = address
            if live > run[2]:
                run[2], run[3] = live, text
        elif run is not None:
            yield run
            run = None
    if run is not None:
        yield run


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("listing")
    parser.add_argument("--peaks", type=int, default=0)
    args = parser.parse_args()
    instrs, labels = read(args.listing)
    if not instrs:
        raise SystemExit(f"{args.listing}: no instructions with life ranges (nvdisasm -plr?)")
    peak = max(live for _, _, live in instrs)
    spills = sum(("LDL" in t) or ("STL" in t) for _, t, _ in instrs)
    print(f"{len(instrs)} instructions, peak {peak} live registers, {spills} LDL/STL")
    for first, last, body in loops(instrs, labels):
        count = lambda word: sum(word in t for _, t, _ in body)  # noqa: E731
        print(f"  loop {first:05x}-{last:05x}: {len(body)} instructions, "
              f"{count('HGMMA')} HGMMA, {count('MUFU.EX2')} MUFU.EX2, "
              f"{count('LDL') + count('STL')} LDL/STL, peak {max(l for _, _, l in body)}")
    if args.peaks:
        runs = sorted(stretches(instrs, peak - 12), key=lambda r: -r[2])[: args.peaks]
        for first, last, live, text in runs:
            print(f"  {live} live at {first:05x}-{last:05x}: {text[:70]}")


if __name__ == "__main__":
    main()
