"""The SASS instructions with the most warp-stall samples, per kernel, from an ncu source
export (``ncu --import R --page source --csv --print-source sass``).

Usage: python benchmarks/ncu_top.py export.csv [--top 25]
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import Counter


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    with open(args.csv, newline="") as f:
        rows = list(csv.reader(f))
    kernels: list[tuple[str, list[list[str]]]] = []
    header: list[str] = []
    for row in rows:
        if row and row[0] == "Kernel Name":
            kernels.append((row[1], []))
        elif row and row[0] == "Address":
            header = row
        elif kernels and header and len(row) >= len(header):
            kernels[-1][1].append(row)
    seen = set()
    for name, body in kernels:
        if name in seen:
            continue
        seen.add(name)
        col = {h: i for i, h in enumerate(header)}
        samples = col["Warp Stall Sampling (All Samples)"]
        executed = col["Instructions Executed"]
        data = [(r, int(r[samples] or 0), int(r[executed] or 0)) for r in body]
        total = sum(d[1] for d in data) or 1
        counts = Counter(d[2] for d in data if d[2])
        print(
            f"== {name}: {len(data)} instructions, {total} samples; executions: "
            f"{counts.most_common(4)}"
        )
        stall_cols = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
        for row, n, e in sorted(data, key=lambda d: -d[1])[: args.top]:
            src = row[col["Source"]]
            why = sorted(((int(row[col[h]] or 0), h[6:]) for h in stall_cols), reverse=True)[:2]
            print(f"{100 * n / total:5.1f}%  {e:7d}  {src[:60]:60s}  {why}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
