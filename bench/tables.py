#!/usr/bin/env python3
"""Markdown tables for bench/RESULTS.md from fnbench and compare.py CSV files.

    python3 bench/tables.py fnbench RUN.csv          # forward and backward grids
    python3 bench/tables.py graph RUN.csv            # the graph preset's rows
    python3 bench/tables.py peers F.csv[:F] J.csv:J  # side by side, later files win per cell
                                                     # (a file without fusednorm's row adds peers)
    python3 bench/tables.py peers L.csv:L fnbench=K.csv:K  # ... and fnbench's own numbers

For `peers`, each file may carry a label after a colon; a cell's label is printed in a `run`
column, so that a table merged from several runs says where each row comes from: a file with
fusednorm's row for a cell replaces the cell, one with only peers' rows adds them to it, and the
run column then names both runs ("BR + BS"). The summary
lines after each peer table count the cells where fusednorm is faster than the better of torch
eager and torch.compile, and at least 1.15x faster. A `fnbench=` file adds fnbench's number
for the cell (labelled with its run) and its ratio to the same peers, counted separately. A
peer column that no file measured (e.g. Liger when it was not installed: no cell "ok") is left
out.
"""

import csv
import sys

OPS = {"ln": "LayerNorm", "rms": "RMSNorm"}
DTYPES = ["bf16", "fp16", "fp32"]


def grid_key(m, n):
    """Rows of the grid: M*N = 2^27 by N first, then the extra shapes in a fixed order."""
    main = m * n == 1 << 27
    return (0 if main else 1, n if main else {384: 0, 768: 1, 5120: 2}.get(n, 3), m)


def fnbench_tables(path):
    rows = list(csv.DictReader(open(path)))
    cells = {}
    for r in rows:
        cells[(r["op"], r["dtype"], int(r["M"]), int(r["N"]))] = r
    shapes = sorted({(k[2], k[3]) for k in cells}, key=lambda s: grid_key(*s))
    out = []
    for direction in ("fwd", "bwd"):
        cols = [(f"{op}-{direction}", dt) for op in ("ln", "rms") for dt in DTYPES]
        out.append("| M x N | " + " | ".join(f"{op} {dt}" for op, dt in cols) + " |")
        out.append("|---" * (len(cols) + 1) + "|")
        for m, n in shapes:
            line = []
            for op, dt in cols:
                r = cells.get((op, dt, m, n))
                line.append(
                    f"{float(r['GBps']):.0f} ({100 * float(r['fraction_of_copy']):.0f}%)"
                    if r
                    else ""
                )
            out.append(f"| {m} x {n} | " + " | ".join(line) + " |")
        out.append("")
    return "\n".join(out)


def graph_table(path):
    out = [
        "| op | dtype | M | N | time (us) | GB/s | copy GB/s | % of copy |",
        "|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    for r in csv.DictReader(open(path)):
        out.append(
            f"| {r['op']} | {r['dtype']} | {r['M']} | {r['N']} | {float(r['median_us']):.2f} | "
            f"{float(r['GBps']):.0f} | {float(r['copy_GBps']):.0f} | "
            f"{100 * float(r['fraction_of_copy']):.1f}% |"
        )
    return "\n".join(out)


def peer_tables(specs):
    cells = {}  # (op, dir, dtype, M, N) -> {library: row}, plus "_run"
    fnb, fnb_label = {}, None  # (op, dir, dtype, M, N) -> GB/s, from fnbench
    for spec in specs:
        if spec.startswith("fnbench="):
            path, _, fnb_label = spec[len("fnbench=") :].partition(":")
            for r in csv.DictReader(open(path)):
                op, direction = r["op"].split("-", 1)
                fnb[(op, direction, r["dtype"], int(r["M"]), int(r["N"]))] = float(r["GBps"])
            continue
        path, _, label = spec.partition(":")
        for r in csv.DictReader(open(path)):
            key = (r["op"], r["direction"], r["dtype"], int(r["M"]), int(r["N"]))
            if r["library"] == "fusednorm":
                cells[key] = {"_run": label}  # a later run replaces the whole cell
            cell = cells.setdefault(key, {"_run": label})
            if label not in cell["_run"].split(" + "):  # a later run's peer joins the cell
                cell["_run"] += " + " + label
            cell[r["library"]] = r
    libs = [
        x
        for x in ("torch", "compile", "liger")
        if any(x in c and c[x]["status"] == "ok" for c in cells.values())
    ]
    titles = {"torch": "torch eager", "compile": "torch.compile", "liger": "Liger"}
    fnb_cols = (
        f" | fusednorm in fnbench (run {fnb_label}) | fnbench / best of eager and compile"
        if fnb
        else ""
    )
    out = []
    for direction in ("fwd", "bwd"):
        keys = sorted(
            (k for k in cells if k[1] == direction),
            key=lambda k: (k[0], DTYPES.index(k[2]), grid_key(k[3], k[4])),
        )
        out.append(
            "| op | dtype | M x N | run | fusednorm GB/s (% of copy) | "
            + " | ".join(titles[x] for x in libs)
            + " | copy GB/s | fusednorm / best of eager and compile"
            + fnb_cols
            + " |"
        )
        out.append("|---" * (len(libs) + 7 + (2 if fnb else 0)) + "|")
        faster = fast115 = total = 0
        fnb_faster = fnb_fast115 = fnb_total = 0
        for k in keys:
            c = cells[k]
            ours = c.get("fusednorm")
            if not ours or ours["status"] != "ok":
                continue

            def gbps(lib):
                r = c.get(lib)
                if r is None:
                    return None, "n/a"
                if r["status"] != "ok":
                    return None, r["status"].split(":")[0]
                return float(r["gbps"]), f"{float(r['gbps']):.0f}"

            g = float(ours["gbps"])
            copy = float(ours["copy_gbps"])
            peers = [gbps(x) for x in libs]
            best = max(
                [p[0] for p, x in zip(peers, libs) if x in ("torch", "compile") and p[0]] or [0]
            )
            ratio = g / best if best else float("nan")
            total += 1
            faster += ratio > 1
            fast115 += ratio >= 1.15
            extra = ""
            if fnb:
                f = fnb.get(k)
                if f is not None and best:
                    fnb_total += 1
                    fnb_faster += f / best > 1
                    fnb_fast115 += f / best >= 1.15
                    extra = f" | {f:.0f} | {f / best:.2f}x"
                else:
                    extra = " | n/a | n/a"
            out.append(
                f"| {OPS[k[0]]} | {k[2]} | {k[3]} x {k[4]} | {c['_run']} | {g:.0f} ({100 * g / copy:.0f}%) | "
                + " | ".join(p[1] for p in peers)
                + f" | {copy:.0f} | {ratio:.2f}x{extra} |"
            )
        out.append("")
        out.append(
            f"{direction}: faster than the better of eager and compile in {faster} of {total} "
            f"cells, at least 1.15x in {fast115}."
        )
        if fnb:
            out.append(
                f"{direction}, fnbench's numbers (run {fnb_label}) against the same peers: faster "
                f"in {fnb_faster} of {fnb_total} cells, at least 1.15x in {fnb_fast115}."
            )
        out.append("")
    return "\n".join(out)


def main(argv):
    if len(argv) < 2 or argv[0] not in ("fnbench", "graph", "peers"):
        sys.exit(__doc__)
    if argv[0] == "fnbench":
        print(fnbench_tables(argv[1]))
    elif argv[0] == "graph":
        print(graph_table(argv[1]))
    else:
        print(peer_tables(argv[1:]))


if __name__ == "__main__":
    main(sys.argv[1:])
