"""The grid tier's forward and backward at different points: µs per step of each pairing.

The forward and the backward are separate launches of one library, each reading only what
the other leaves in memory (the saved states; each call has a fresh exchange buffer), so the
plan may run them at different points (``Plan.backward_point``). For each problem this times a
training step (T = 256 and 1024, bf16; medians of 9 calls, CUDA events) with the
forward of one ``grid_mma`` point and the backward of another, and prints the per-step slopes
and the outputs' and gradients' largest difference from the first pairing (relative to its
largest value; bf16 sums in another order differ by a few 1e-3).

    python benchmarks/backward_points.py [--out FILE.txt]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

#: (cell, heads, head dim, batch), and the (forward, backward) points timed for each: these
#: (n_tiles, unit_tiles, blocks_per_sm) pairs, and the plan's own (its forward and backward
#: points, each point both ways); pairings a problem does not admit are skipped.
PROBLEMS = (
    ("lstm", 6, 128, 16),
    ("lstm", 3, 256, 16),
    ("lstm", 2, 384, 16),
    ("gru", 6, 128, 16),
    ("gru", 1, 768, 16),
    ("lstm", 6, 128, 64),
)
PAIRS = (
    ((1, 2, 1), (1, 2, 1)),
    ((1, 1, 2), (1, 1, 2)),
    ((1, 2, 1), (1, 1, 2)),
    ((2, 1, 1), (2, 1, 1)),
    ((1, 2, 1), (2, 1, 1)),
)
STEPS = (256, 1024)
ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="also write the lines to this file")
    args = ap.parse_args()

    import torch

    import rnncc
    from rnncc.bench.timing import cuda_timer
    from rnncc.runtime.build import device_arch
    from rnncc.runtime.kernels import KernelOps
    from rnncc.tiling import Problem, caps_for_device
    from rnncc.tiling.solve import feasible_plans, solve

    caps, arch = caps_for_device(), device_arch()
    todo = []
    for name, heads, d, batch in PROBLEMS:
        cell = rnncc.load(ROOT / "examples" / f"{name}.rnn")
        p = Problem.from_cell(cell.ir, heads=heads, head_dim=d, batch=batch, dtype="bf16")
        plans = {
            tuple(v for _, v in pl.point): pl
            for pl in feasible_plans(p, caps)
            if pl.variant == "grid_mma"
        }
        todo.append((name, heads, d, batch, cell, plans, solve(p, caps)))
    with ThreadPoolExecutor(8) as pool:  # the libraries, built at once
        ops = list(
            pool.map(
                lambda t: KernelOps(
                    t[4].ir, t[4].backward_ir, next(iter(t[5].values())).build, arch
                ),
                todo,
            )
        )

    lines = [f"# benchmarks/backward_points.py on {torch.cuda.get_device_name()}, bf16"]
    for (name, heads, d, batch, cell, plans, planned), run in zip(todo, ops, strict=True):
        fw_point = tuple(v for _, v in planned.point)
        bw_point = tuple(v for _, v in planned.backward_point)
        lines.append(
            f"## {name} {heads}x{d} B {batch}: planned forward {fw_point}, backward {bw_point}"
        )
        own = ((fw_point, fw_point), (bw_point, bw_point), (fw_point, bw_point))
        first = None
        for fw, bw in dict.fromkeys(PAIRS + own):
            if fw not in plans or bw not in plans:
                continue
            launch = dataclasses.replace(plans[fw].launch, backward=plans[bw].launch.backward)
            times, got = {}, None
            for T in STEPS:
                times[T], got = _time(cell, run, launch, heads, d, batch, T, cuda_timer)
            fw_us = (times[STEPS[1]][0] - times[STEPS[0]][0]) / (STEPS[1] - STEPS[0]) * 1e3
            fwbw_us = (times[STEPS[1]][1] - times[STEPS[0]][1]) / (STEPS[1] - STEPS[0]) * 1e3
            first = first or got
            diff = max(
                ((a - b).abs().max() / b.abs().max().clamp_min(1e-9)).item()
                for a, b in zip(got, first, strict=True)
            )
            lines.append(
                f"forward {fw} backward {bw}: T {STEPS[1]} fw {times[STEPS[1]][0]:.3f} fwbw "
                f"{times[STEPS[1]][1]:.3f} ms; per step fw {fw_us:.3f} bw {fwbw_us - fw_us:.3f} µs; "
                f"difference {diff:.1e}"
            )
            print(lines[-1], flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


def _time(cell: Any, run: Any, launch: Any, heads: int, d: int, B: int, T: int, timer: Any) -> Any:
    """(fw ms, fwbw ms) medians at ``T``, and the outputs and gradients of one call, on
    ``variant_costs.workload``'s inputs (bf16)."""
    import torch
    from variant_costs import workload

    from rnncc.bench import Case

    w = workload(cell, run, launch, Case("", B, T, heads, d, "bf16"), "cuda")
    x = w.make_inputs(0)

    def fw() -> None:
        with torch.no_grad():
            w.forward(x)

    def fwbw() -> None:
        w.forward(x).float().sum().backward()

    for _ in range(3):
        fw()
        fwbw()
    times = (
        statistics.median(timer(fw) for _ in range(9)),
        statistics.median(timer(fwbw) for _ in range(9)),
    )
    for t in x:
        if t is not None:
            t.grad = None
    y = w.forward(x)
    y.float().sum().backward()
    Wx, R, _ = x
    return times, (y.float(), Wx.grad.float(), R.grad.float())


if __name__ == "__main__":
    main()
