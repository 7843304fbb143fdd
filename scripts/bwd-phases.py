"""Summarises the backward's phase clocks (src/kernels/sm90/bwd_trace.cuh) read from stdin: per
consumer group of the CTAs that printed, each phase's cycles per q block and its share of the
group's cycles; the other lines (the bench's figures) pass through.

    flexcp bench ... --backward | python3 scripts/bwd-phases.py
"""
import sys


def main():
    rows = []
    for line in sys.stdin:
        if not line.startswith("bwd-phases "):
            sys.stdout.write(line)
            continue
        words = line.split()[1:]
        rows.append({k: int(v) for k, v in zip(words[::2], words[1::2])})
    if not rows:
        print("bwd-phases: no phase lines (was the build made with FLEXCP_SM90_BWD_TRACE?)")
        return
    names = [k for k in rows[0] if k not in ("cta", "group", "blocks", "total")]
    print("cycles per q block (share of the group's total)")
    print("cta grp blocks " + " ".join(f"{n:>16}" for n in names))
    for r in rows:
        b = max(r["blocks"], 1)
        cells = [f"{r[n] / b:8.0f} ({100 * r[n] / max(r['total'], 1):4.1f}%)" for n in names]
        print(f"{r['cta']:3d} {r['group']:3d} {r['blocks']:6d} " + " ".join(f"{c:>16}" for c in cells))


if __name__ == "__main__":
    main()
