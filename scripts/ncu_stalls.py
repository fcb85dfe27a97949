#!/usr/bin/env python3
"""Developer tool: where a kernel's warps stall, from Nsight Compute's per-instruction samples.

On the GPU machine (a report taken with `--set full --import-source yes`):
    ncu --clock-control none -k regex:KERNEL --launch-skip 3 --launch-count 1 --set full \\
        --import-source yes -o REP build/bench/fnbench --quiet --iters 10 CELL
    ncu -i REP.ncu-rep --page source --csv --print-source sass > REP-sass.csv
    python3 scripts/ncu_stalls.py REP-sass.csv [TOP]
prints the share of the stall samples by reason, then the TOP instructions (default 30) with the
most samples in listing order: their index in the SASS listing, address, share of the samples,
the instruction and its two largest reasons. This is how ncu27 (bench/tune/ncu27.txt) was read.
"""
import csv
import sys


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 2
    top_n = int(argv[2]) if len(argv) > 2 else 30
    with open(argv[1], newline="") as f:
        rows = list(csv.reader(f))
    # ncu's source page: a title line, the header, then one line a SASS instruction.
    header_at = next((i for i, r in enumerate(rows) if "Warp Stall Sampling (All Samples)" in r),
                     None)
    if header_at is None:
        print("%s: no 'Warp Stall Sampling (All Samples)' column (a --page source --csv "
              "--print-source sass export of a --set full report?)" % argv[1], file=sys.stderr)
        return 1
    header = rows[header_at]
    body = [r for r in rows[header_at + 1:] if len(r) == len(header)]
    col = {name: i for i, name in enumerate(header)}
    samples = col["Warp Stall Sampling (All Samples)"]
    reasons = [n for n in header if n.startswith("stall_") and "Not Issued" not in n]

    def value(r, c):
        try:
            return float(r[c] or 0)
        except ValueError:
            return 0.0

    total = sum(value(r, samples) for r in body)
    if total <= 0:
        print("no stall samples in %s" % argv[1], file=sys.stderr)
        return 1
    print("total samples %.0f" % total)
    by_reason = {n: sum(value(r, col[n]) for r in body) for n in reasons}
    for name, v in sorted(by_reason.items(), key=lambda t: -t[1])[:10]:
        print("%-28s %5.1f%%" % (name, 100 * v / total))
    top = sorted(range(len(body)), key=lambda i: -value(body[i], samples))[:top_n]
    for i in sorted(top):
        r = body[i]
        main_two = sorted(((value(r, col[n]), n) for n in reasons), reverse=True)[:2]
        print("%5d %s %5.1f%% %-60s %s" % (i, r[0], 100 * value(r, samples) / total, r[1][:60],
                                           " ".join("%s=%.0f" % (n[6:], v) for v, n in main_two)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
