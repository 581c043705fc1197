"""Per-step cost of a fused kernel: forward (no grad) and forward + backward times at several
sequence lengths, the slope giving µs per step; run under ncu for the stall breakdown.

Usage (GPU machine): python benchmarks/profile_fused.py examples/lstm.rnn --heads 12 --dim 64
    --batch 16 [--dtype bf16] [--steps 16,256,1024] [--once T]
``--once T`` runs one forward and one backward at T (for ncu); otherwise prints the times.
The event times include the host's time per call, which at small T is most of the
measurement: the slope understates the kernels' per-step cost (``kernel_times.py`` gives the
kernels alone).
"""

from __future__ import annotations

import argparse

import torch

import rnncc
from rnncc.testing import random_inputs

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("cell")
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--dtype", default="bf16", choices=DTYPES)
    ap.add_argument("--steps", default="16,256,1024")
    ap.add_argument("--once", type=int, default=0)
    ap.add_argument(
        "--kernels", type=int, default=0, help="CUDA kernel table of the suite's fwbw at T"
    )
    args = ap.parse_args()
    cell = rnncc.load(args.cell)
    dtype = DTYPES[args.dtype]

    def inputs(T: int) -> list:
        x = random_inputs(cell.ir, args.batch, T, args.heads, args.dim, seed=0)
        order = ("Wx", "R", "b", "states", "params")
        return [None if x[k] is None else x[k].to("cuda", dtype) for k in order]

    if args.kernels:
        from torch.profiler import ProfilerActivity, profile

        # The benchmark suite's fwbw: the outputs' sum, backward (rnncc.bench).
        x = [None if v is None else v.requires_grad_() for v in inputs(args.kernels)]
        for _ in range(2):
            cell(*x, backend="fused")[0].sum().backward()
        torch.cuda.synchronize()
        for v in x:  # as the suite does: no gradient accumulation kernels in the table
            if v is not None:
                v.grad = None
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            cell(*x, backend="fused")[0].sum().backward()
            torch.cuda.synchronize()
        table = prof.key_averages().table(
            sort_by="cuda_time_total", row_limit=20, max_name_column_width=100
        )
        print(table)
        return
    if args.once:
        x = inputs(args.once)
        with torch.no_grad():
            cell(*x, backend="fused")
        xs = [None if v is None else v.requires_grad_() for v in x]
        y, last = cell(*xs, backend="fused")
        (y.float().sum() + last.float().sum()).backward()
        torch.cuda.synchronize()
        return
    rows = []
    for T in (int(s) for s in args.steps.split(",")):
        x = inputs(T)
        xs = [None if v is None else v.detach().requires_grad_() for v in x]
        times = {"fw": [], "fwbw": []}
        for rep in range(13):
            for mode in ("fw", "fwbw"):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(True)
                torch.cuda.synchronize()
                start.record()
                if mode == "fw":
                    with torch.no_grad():
                        cell(*x, backend="fused")
                else:
                    y, last = cell(*xs, backend="fused")
                    (y.float().sum() + last.float().sum()).backward()
                end.record()
                torch.cuda.synchronize()
                if rep >= 3:
                    times[mode].append(start.elapsed_time(end))
        rows.append((T, *(sorted(times[m])[len(times[m]) // 2] for m in ("fw", "fwbw"))))
    print(f"{args.cell} {args.heads}x{args.dim} B={args.batch} {args.dtype}")
    for T, fw, fwbw in rows:
        print(f"T={T:5d}  fw {fw:8.3f} ms  fwbw {fwbw:8.3f} ms")
    (t0, fw0, fb0), (t1, fw1, fb1) = rows[0], rows[-1]
    print(
        f"per step: fw {1e3 * (fw1 - fw0) / (t1 - t0):.3f} µs, fwbw {1e3 * (fb1 - fb0) / (t1 - t0):.3f} µs"
    )


if __name__ == "__main__":
    main()
