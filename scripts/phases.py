"""Summarises the kernels' phase clocks (src/kernels/sm90/phase_clock.cuh) read from stdin: for
each kernel (`fwd-phases`, `bwd-phases` lines), per consumer group of the CTAs that reported and
per launch, each phase's cycles per block and its share of the group's cycles; then the last
launch's timeline (`fwd-timeline`, `bwd-timeline`): for a window of blocks of CTA 0, when each
group's block started and each of its phases ended, in cycles from group 0's start of the same
block, on the SM's one clock. The other lines (the bench's figures) pass through. Each launch prints its lines, so a bench run shows several
tables per kernel (warm-up, the timed runs, fwd+bwd).

    flexcp bench ... --backward | python3 scripts/phases.py
"""
import sys


def main():
    tables = {}  # kernel -> rows, in order
    timelines = {}  # kernel -> {(block, group): {"start": t, phase: t}}, the last launch's
    for line in sys.stdin:
        words = line.split()
        if words and words[0].endswith("-timeline"):
            f = words[1:]
            row = {k: None if v == "none" else int(v) for k, v in zip(f[::2], f[1::2])}
            timelines.setdefault(words[0], {})[(row.pop("block"), row.pop("group"))] = row
            continue
        if not words or not words[0].endswith("-phases"):
            sys.stdout.write(line)
            continue
        fields = words[1:]
        tables.setdefault(words[0], []).append(
            {k: int(v) for k, v in zip(fields[::2], fields[1::2])})
    if not tables and not timelines:
        print("phases: no phase lines (was the build made with FLEXCP_SM90_PHASE_CLOCKS?)")
        return
    for kernel, rows in tables.items():
        names = [k for k in rows[0] if k not in ("cta", "group", "blocks", "total")]
        print(f"{kernel}: cycles per block (share of the group's total)")
        print("cta grp blocks " + " ".join(f"{n:>16}" for n in names))
        for r in rows:
            b = max(r["blocks"], 1)
            cells = [f"{r[n] / b:8.0f} ({100 * r[n] / max(r['total'], 1):4.1f}%)" for n in names]
            print(f"{r['cta']:3d} {r['group']:3d} {r['blocks']:6d} "
                  + " ".join(f"{c:>16}" for c in cells))
    for kernel, rows in timelines.items():
        names = [k for k in next(iter(rows.values())) if k != "start"]
        print(f"{kernel}: cycles from group 0's start of the block to each phase's end "
              "(-: not reached)")
        print("block grp " + " ".join(f"{n:>9}" for n in ["start"] + names))
        for (block, group), row in sorted(rows.items()):
            base = rows.get((block, 0), row)["start"]
            cells = [row["start"] - base] + [None if row[n] is None else row[n] - base for n in names]
            print(f"{block:5d} {group:3d} "
                  + " ".join(f"{c:9d}" if c is not None else f"{'-':>9}" for c in cells))


if __name__ == "__main__":
    main()
