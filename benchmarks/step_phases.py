"""Where a grid step's time goes: the clock cycles of each phase of a step, per kernel.

Each point runs one forward and backward of a one-layer ``rnncc.RNN`` (T = 1024, bf16) in a
child process whose library is built with ``-DRNNCC_STEP_TRACE`` (``templates/step_trace.cuh``:
thread 0 of each block of grid_mma, grid_stream or grid_sparse clocks the phases of steps
100-899, and three blocks of the first head and chunk print the means). The parent averages
the printed blocks and prints cycles per phase. The marks cost a few cycles each and may move
ptxas's schedule a little: compare phases with each other, and totals only with traced totals.

    python benchmarks/step_phases.py --points lstm:768:16 lstm:768:16:bi lstm:6x128:16:1,1,2 \\
        lstm:2304:4:s0.3 [--out FILE.txt]

A point is ``cell:size:batch[:bi][:nt,uw,bps][:sDENSITY]``: a cell of ``examples/``, its size
as the head dim (one head) or ``heads x head dim`` (``6x128``), ``bi`` for a bidirectional layer
(its two directions as two heads of one launch, with the kernels of per-row lengths), a
grid_mma point (n_tiles, unit_tiles, blocks_per_sm) to run instead of the planner's choice,
and ``s0.3`` for R pruned by magnitude to that density (``rnncc.RNN(sparsity=...)``: the
grid_sparse kernels where the planner picks them).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

T = 1024
#: The phases between each template's marks, in step order, by variant and direction.
GRID_PHASES = {
    "fw": (
        "wait for the counter",
        "product, first n tile (h's loads included)",
        "product, the other n tiles",
        "barrier (grid_stream: and the streamed k tiles' product)",
        "sums of the warps' parts",
        "cell, h published",
        "count (release)",
        "outputs, history, next W x",
    ),
    "bw": (
        "cell, dg published",
        "count (release)",
        "dWx, dGr",
        "wait for the counter (next inputs' loads issued)",
        "product (dg's loads included)",
        "barrier",
        "sums of the warps' parts",
    ),
}
SPARSE_PHASES = {
    "fw": (
        "wait for the counter",
        "h staged into shared memory",
        "product, slots' sums",
        "cell, h published",
        "count (release)",
        "outputs, history, next W x",
    ),
    "bw": (
        "cell, dg published",
        "count (release)",
        "dWx, dGr, next inputs' loads issued",
        "wait for the counter",
        "dg staged into shared memory",
        "product, slots' sums",
        "sums into the states' cotangents",
    ),
}
PHASES = {"grid_mma": GRID_PHASES, "grid_stream": GRID_PHASES, "grid_sparse": SPARSE_PHASES}
LINE = re.compile(r"rnncc-step-trace (fw|bw) (\d+) (\d+) (\d+) (\d+) (\d+): ([\d ]+)")


def child(point: str) -> None:
    import torch

    import rnncc
    import rnncc.runtime.build as build
    import rnncc.variants.grid_mma as grid_mma
    import rnncc.variants.grid_sparse as grid_sparse

    build.NVCC_FLAGS = (*build.NVCC_FLAGS, "-DRNNCC_STEP_TRACE")  # a library of its own
    # The trace's sums take 80 bytes of static shared memory: plans leave them room (a
    # grid_sparse plan may fill a block's shared memory to within a few bytes).
    grid_mma.LIBRARY_SMEM = grid_sparse.LIBRARY_SMEM = grid_mma.LIBRARY_SMEM - 128
    name, size, batch, *rest = point.split(":")
    heads, head_dim = (int(v) for v in size.split("x")) if "x" in size else (1, int(size))
    if forced := [r for r in rest if "," in r]:  # plan only this grid_mma point
        from rnncc.variants.grid_mma import GridMma

        values = dict(
            zip(("n_tiles", "unit_tiles", "blocks_per_sm"), map(int, forced[0].split(",")))
        )
        GridMma.domains = lambda self, problem, caps: {k: (v,) for k, v in values.items()}
    example = Path(__file__).resolve().parent.parent / "examples" / f"{name}.rnn"
    layer = rnncc.RNN(
        rnncc.load(example),
        heads * head_dim,
        heads * head_dim,
        num_heads=heads,
        bidirectional="bi" in rest,
        backend="fused",
        device="cuda",
        dtype=torch.bfloat16,
        sparsity=next((float(r[1:]) for r in rest if r.startswith("s")), None),
    )
    x = torch.randn(int(batch), T, heads * head_dim, device="cuda", dtype=torch.bfloat16)
    x.requires_grad_(True)
    layer(x)[0].float().sum().backward()
    torch.cuda.synchronize()
    plan = layer.cell.last_plan
    print(f"plan {plan.variant} {dict(plan.point)}", flush=True)


def measure(point: str) -> tuple[str, dict[tuple[str, int, int], list[float]]]:
    run = subprocess.run(
        [sys.executable, __file__, "--child", point], capture_output=True, text=True, check=False
    )
    if run.returncode:
        raise SystemExit(f"{point}: the child failed\n{run.stdout}\n{run.stderr}")
    blocks: dict[tuple[str, int, int], list[list[int]]] = defaultdict(list)
    plan = ""
    for line in run.stdout.splitlines():
        if line.startswith("plan "):
            plan = line[5:]
        elif m := LINE.match(line):
            kind, nt, uw = m.group(1), int(m.group(2)), int(m.group(3))
            blocks[(kind, nt, uw)].append([int(v) for v in m.group(7).split()])
    if not blocks:
        raise SystemExit(f"{point}: no trace lines (was the library built with the trace?)")
    means = {
        key: [sum(col) / len(rows) for col in zip(*rows)] for key, rows in sorted(blocks.items())
    }
    return plan, means


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", nargs="+", default=["lstm:768:16", "lstm:768:16:bi"])
    ap.add_argument("--out", help="also write the table to this file")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return
    import torch

    lines = [
        f"# benchmarks/step_phases.py on {torch.cuda.get_device_name()}, T = {T}, bf16; "
        "clock cycles per step of thread 0 (a product and a cell warp's lane), mean of "
        "steps 100-899 and of blocks 0, x / 2 and x - 1 of the first head and chunk"
    ]
    for point in args.points:
        plan, means = measure(point)
        lines.append(f"\n## {point}: {plan}")
        for (kind, nt, uw), cycles in means.items():
            names = PHASES[plan.split()[0]][kind]
            total = sum(cycles[: len(names)])
            shape = (
                f"{nt} units, {uw} threads"
                if plan.startswith("grid_sparse")
                else f"n_tiles {nt}, unit_tiles {uw}"
            )
            lines.append(f"{kind} kernel, {shape}: {total:.0f} cycles a step")
            for phase, c in zip(names, cycles):
                lines.append(f"  {c:7.0f}  {100 * c / total:4.1f} %  {phase}")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
