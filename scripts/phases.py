"""Summarises the kernels' phase clocks (src/kernels/sm90/phase_clock.cuh) read from stdin: for
each kernel (`fwd-phases`, `bwd-phases` lines), per consumer group of the CTAs that reported and
per launch, each phase's cycles per block and its share of the group's cycles; the other lines
(the bench's figures) pass through. Each launch prints its lines, so a bench run shows several
tables per kernel (warm-up, the timed runs, fwd+bwd).

    flexcp bench ... --backward | python3 scripts/phases.py
"""
import sys


def main():
    tables = {}  # kernel -> rows, in order
    for line in sys.stdin:
        words = line.split()
        if not words or not words[0].endswith("-phases"):
            sys.stdout.write(line)
            continue
        fields = words[1:]
        tables.setdefault(words[0], []).append(
            {k: int(v) for k, v in zip(fields[::2], fields[1::2])})
    if not tables:
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


if __name__ == "__main__":
    main()
