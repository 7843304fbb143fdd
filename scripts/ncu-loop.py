"""Where a kernel's main loop spends its warps' time, from the per-instruction table that
`KEEP_CSV=1 SOURCE=1 scripts/gpu-profile.sh` keeps (sass-*.csv.gz).

The loop is found by its execution count: the count shared by the instructions that execute the
most in total (a steady loop's body runs once per iteration, its rare paths less). Prints the
loop's share of the stall samples, its stall reasons, and with --listing every loop instruction
with its share and largest reasons, in address order. Two kernels' tables read side by side
(flexcp's and FlashAttention-4's, bench/results/h100-2026-12-05.md section 9) show which stretch
of a block differs; scale each kernel's shares by its duration to compare time.
    python3 scripts/ncu-loop.py OUT/sass-fwd_kernel-full-32k.csv.gz [--listing]
"""
import collections
import csv
import gzip
import sys

TOTAL = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def load(path):
    with gzip.open(path, "rt") as f:
        lines = f.read().splitlines()
    first = next((i for i, l in enumerate(lines) if l.startswith('"Address"')), len(lines))
    return list(csv.DictReader([l for l in lines[first:] if l.startswith('"')]))


def num(row, col):
    return float((row.get(col) or "0").replace(",", "") or 0)


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    rows = load(sys.argv[1])
    if not rows or TOTAL not in rows[0]:
        print("no per-instruction stall samples in", sys.argv[1])
        return 1
    reasons = [c for c in rows[0] if c and c.startswith("stall_") and "Not Issued" not in c]
    grand = sum(num(r, TOTAL) for r in rows) or 1.0
    weight = collections.Counter()
    for r in rows:
        weight[num(r, EXECUTED)] += num(r, EXECUTED)
    count = weight.most_common(1)[0][0]
    loop = [(i, r) for i, r in enumerate(rows) if num(r, EXECUTED) == count]
    share = sum(num(r, TOTAL) for _, r in loop) / grand
    print(f"loop: {len(loop)} instructions executed {count:.4g} times (rows {loop[0][0]}-"
          f"{loop[-1][0]}), {100 * share:.1f}% of {grand:.0f} stall samples")
    totals = {c: sum(num(r, c) for _, r in loop) / grand for c in reasons}
    print("  " + " ".join(f"{c[6:]}={100 * v:.1f}" for c, v in
                          sorted(totals.items(), key=lambda x: -x[1]) if v >= 0.002))
    if "--listing" in sys.argv:
        for i, r in loop:
            why = sorted(((num(r, c), c[6:]) for c in reasons), reverse=True)[:2]
            print("%5d %6.2f  %-58s %s" % (i, 100 * num(r, TOTAL) / grand,
                                           (r.get("Source") or "").strip()[:58],
                                           " ".join(f"{c}={100 * v / grand:.2f}"
                                                    for v, c in why if v > 0)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
