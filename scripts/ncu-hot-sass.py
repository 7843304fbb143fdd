"""The SASS instructions where a kernel's warps stalled most, from an Nsight Compute report with the
SourceCounters section: `ncu --import R.ncu-rep --page source --csv --print-source sass` on stdin.
Prints the top instructions by stall samples, each with its largest stall reasons, so that a
profile names the lines to work on (scripts/gpu-profile.sh runs it with SOURCE=1)."""
import csv
import sys


def main():
    top = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    lines = sys.stdin.readlines()
    # ncu prints a banner and a "Kernel Name" line before the table's header.
    first = next((i for i, l in enumerate(lines) if l.startswith('"Address"')), len(lines))
    lines = [l for l in lines[first:] if l.startswith('"')]
    rows = list(csv.DictReader(lines))
    if not rows:
        print("no source table in the input")
        return 1
    cols = [c for c in rows[0] if c]  # a row longer than the header has a None key
    total = next((c for c in cols if c.startswith("Warp Stall Sampling (All")), None)
    if total is None:
        print("no stall-sampling column; columns:", ", ".join(cols))
        return 1
    num = lambda r, c: float((r.get(c) or "0").replace(",", "") or 0)
    reasons = [c for c in cols if c.startswith("stall_") or c.lower().startswith("stall ")]
    grand = sum(num(r, total) for r in rows) or 1.0
    print(f"{len(rows)} instructions, {grand:.0f} stall samples; columns of reasons: {len(reasons)}")
    for r in sorted(rows, key=lambda r: -num(r, total))[:top]:
        why = sorted(((num(r, c), c) for c in reasons), reverse=True)[:3]
        print("%5.1f%%  %-8s %-60s %s" % (
            100 * num(r, total) / grand, r.get("Address", ""), (r.get("Source") or "")[:60],
            " ".join(f"{c}={v:.0f}" for v, c in why if v > 0)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
