"""Where a kernel's warps stalled, from an Nsight Compute report with the SourceCounters section:
`ncu --import R.ncu-rep --page source --csv --print-source sass` on stdin (or the gzip copy that
`KEEP_CSV=1 SOURCE=1 scripts/gpu-profile.sh` keeps, through zcat).

    ... | python3 scripts/ncu-hot-sass.py [TOP]          the TOP instructions by stall samples,
                                                        each with its largest stall reasons
    ... | python3 scripts/ncu-hot-sass.py --loop [--listing]
        the kernel's main loop, found by its execution count (the count shared by the
        instructions that execute the most in total: a steady loop's body runs once an
        iteration, its rare paths less): its share of the samples, its stall reasons, and with
        --listing each of its instructions in address order. Two kernels' loops read side by side
        (flexcp's and FlashAttention-4's, bench/results/h100-2026-12-05.md section 9) show which
        stretch of a block differs; scale each kernel's shares by its duration to compare time.
scripts/gpu-profile.sh runs the first form with SOURCE=1."""
import collections
import csv
import sys

TOTAL = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def num(row, col):
    return float((row.get(col) or "0").replace(",", "") or 0)


def read_rows(lines):
    # ncu prints a banner and a "Kernel Name" line before the table's header.
    first = next((i for i, l in enumerate(lines) if l.startswith('"Address"')), len(lines))
    return list(csv.DictReader([l for l in lines[first:] if l.startswith('"')]))


def top_reasons(row, reasons, scale, n):
    why = sorted(((num(row, c), c) for c in reasons), reverse=True)[:n]
    return " ".join(f"{c}={v / scale:.{0 if scale == 1 else 2}f}" for v, c in why if v > 0)


def hot(rows, reasons, grand, top):
    print(f"{len(rows)} instructions, {grand:.0f} stall samples; columns of reasons: {len(reasons)}")
    for r in sorted(rows, key=lambda r: -num(r, TOTAL))[:top]:
        print("%5.1f%%  %-8s %-60s %s" % (
            100 * num(r, TOTAL) / grand, r.get("Address", ""), (r.get("Source") or "")[:60],
            top_reasons(r, reasons, 1, 3)))


def loop(rows, reasons, grand, listing):
    weight = collections.Counter()
    for r in rows:
        weight[num(r, EXECUTED)] += num(r, EXECUTED)
    count = weight.most_common(1)[0][0]
    body = [(i, r) for i, r in enumerate(rows) if num(r, EXECUTED) == count]
    share = sum(num(r, TOTAL) for _, r in body) / grand
    print(f"loop: {len(body)} instructions executed {count:.4g} times (rows {body[0][0]}-"
          f"{body[-1][0]}), {100 * share:.1f}% of {grand:.0f} stall samples")
    totals = {c: sum(num(r, c) for _, r in body) / grand for c in reasons}
    print("  " + " ".join(f"{c[6:]}={100 * v:.1f}" for c, v in
                          sorted(totals.items(), key=lambda x: -x[1]) if v >= 0.002))
    if listing:
        for i, r in body:
            print("%5d %6.2f  %-58s %s" % (i, 100 * num(r, TOTAL) / grand,
                                           (r.get("Source") or "").strip()[:58],
                                           top_reasons(r, reasons, grand / 100, 2)))


def main():
    rows = read_rows(sys.stdin.readlines())
    if not rows:
        print("no source table in the input")
        return 1
    cols = [c for c in rows[0] if c]  # a row longer than the header has a None key
    if TOTAL not in cols:
        print("no stall-sampling column; columns:", ", ".join(cols))
        return 1
    reasons = [c for c in cols if c.startswith("stall_") and "Not Issued" not in c]
    grand = sum(num(r, TOTAL) for r in rows) or 1.0
    if "--loop" in sys.argv:
        loop(rows, reasons, grand, "--listing" in sys.argv)
    else:
        hot(rows, reasons, grand, int(sys.argv[1]) if len(sys.argv) > 1 else 40)
    return 0


if __name__ == "__main__":
    sys.exit(main())
