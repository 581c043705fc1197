"""Bank conflicts of grid_sparse's operand loads, counted on the CPU for one block's forward
strip of a random mask: the shared-memory wavefronts per step of 32 entries in the order
``templates/grid_sparse.cuh``'s gather writes them (per slot, passes over the bank groups in
group order, one entry of each group that has some left), beside a floor that no order within
a slot can beat.

At B <= 4 a column's operand is 8 bytes, so columns j and j + 16 share banks (16 bank groups):
a step reads each group's distinct columns in as many wavefronts, 2 at best. A slot whose
columns fall n_g in group g takes at least max_g n_g wavefronts over its steps, whatever their
order.

    python benchmarks/sparse_banks.py [--units 2304] [--density 0.3]

A warp's steps are those of the kernel's shared-memory product: its range (an even share of the
block's entries), cut at slot ends, 32 adjacent entries a step; lanes past a part's end read
column 0. At 2304 units and 30 % this counts 2.52 wavefronts a step (ncu: 17.6 % of the
forward's shared loads' wavefronts are excess, entries' loads included; this count gives
17.2 %), against a floor of 2.39.
"""

from __future__ import annotations

import argparse

import numpy as np

GROUPS = 16  # bank groups of 8-byte columns
WARPS = 16  # a block's warps (512 threads)
SMS = 132  # an H100's: a block's units (forward slots: 4 gates x units)


def gather_order(mask: np.ndarray) -> tuple[list[int], list[int]]:
    """The entries' columns in the gather's order, and each slot's start (then the end)."""
    columns: list[int] = []
    start = [0]
    for row in mask:
        cols = np.nonzero(row)[0]
        groups = [list(cols[cols % GROUPS == g]) for g in range(GROUPS)]
        while any(groups):
            for g in groups:
                if g:
                    columns.append(int(g.pop(0)))
        start.append(len(columns))
    return columns, start


def wavefronts(columns: list[int]) -> int:
    """Wavefronts of one step: the most distinct columns any bank group holds."""
    per: dict[int, set[int]] = {}
    for c in columns:
        per.setdefault(c % GROUPS, set()).add(c)
    return max(len(v) for v in per.values())


def product_steps(columns: list[int], start: list[int], warps: int = WARPS) -> list[int]:
    """Each warp step's wavefronts, warp by warp, as the kernel's product takes its range."""
    n, out = len(columns), []
    for w in range(warps):
        lo, hi = n * w // warps, n * (w + 1) // warps
        s = 0
        while start[s + 1] <= lo:
            s += 1
        x = lo
        while x < hi:
            end = min(hi, start[s + 1])
            for x0 in range(x, end, 32):
                step = columns[x0 : min(end, x0 + 32)]
                out.append(wavefronts(step + [0] * (32 - len(step))))
            x, s = end, s + 1
    return out


def floor(mask: np.ndarray) -> float:
    """Wavefronts a step that no order within a slot beats: max_g n_g (and 2 a step) per slot."""
    total = steps = 0
    for row in mask:
        cols = np.nonzero(row)[0]
        k = -(-len(cols) // 32)
        total += max(int(np.bincount(cols % GROUPS, minlength=GROUPS).max()), 2 * k)
        steps += k
    return total / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--units", type=int, default=2304, help="the head dim (an LSTM's)")
    ap.add_argument("--density", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    block = 2 * -(-args.units // (2 * SMS))  # grid_sparse.block_units
    mask = np.random.default_rng(args.seed).random((4 * block, args.units)) < args.density
    columns, start = gather_order(mask)
    steps = product_steps(columns, start)
    mean = sum(steps) / len(steps)
    print(
        f"LSTM {args.units} units, {args.density:.0%}: a block of {block} units, "
        f"{len(columns)} entries, {len(steps)} warp steps"
    )
    print(f"  gather's order: {mean:.2f} wavefronts a step ({100 * (mean / 2 - 1):.1f} % over 2)")
    print(f"  floor of any order within a slot: {floor(mask):.2f}")
    print(f"  with the entries' loads (1 a step): {100 * ((mean + 1) / 3 - 1):.1f} % excess")


if __name__ == "__main__":
    main()
