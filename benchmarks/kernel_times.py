"""Kernel-only times of a cell's fused forward and backward kernels at several T (torch
profiler, device time per call, bf16, five forward + backward calls after three warm-up calls;
then the forward under no_grad, which saves nothing for the backward, five calls likewise).

Unlike ``profile_fused.py``'s slope over CUDA events, these exclude the host's time between
calls, which at small T is most of an event measurement and flattens the slope: on an H200 the
12 x 64 LSTM forward kernel takes 0.74 µs per step where the event slope said 0.58.

Usage (GPU machine): python benchmarks/kernel_times.py CELL.rnn NH D B [T1,T2,...]
    e.g. python benchmarks/kernel_times.py examples/lstm.rnn 12 64 16 256,1024
"""

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

import rnncc
from rnncc.testing import random_inputs

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("cell", help="a .rnn file")
ap.add_argument("NH", type=int)
ap.add_argument("D", type=int)
ap.add_argument("B", type=int)
ap.add_argument("steps", nargs="?", default="1,16,256,1024", help="T1,T2,...")
args = ap.parse_args()
cellf, NH, D, B = args.cell, args.NH, args.D, args.B
cell = rnncc.load(cellf)
for T in [int(v) for v in args.steps.split(",")]:
    x = random_inputs(cell.ir, B, T, NH, D, seed=0)
    xs = [
        None if x[k] is None else x[k].to("cuda", torch.bfloat16).requires_grad_()
        for k in ("Wx", "R", "b", "states", "params")
    ]
    for _ in range(3):
        y, last = cell(*xs, backend="fused")
        (y.float().sum() + last.float().sum()).backward()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            y, last = cell(*xs, backend="fused")
            (y.float().sum() + last.float().sum()).backward()
        torch.cuda.synchronize()
    ev = {}
    for e in prof.key_averages():
        if "fused_" in e.key:
            ev["fw" if "forward" in e.key else "bw"] = e.device_time_total / e.count
    with torch.no_grad():  # the forward alone, saving nothing (the suite's fw)
        for _ in range(3):
            cell(*xs, backend="fused")
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                cell(*xs, backend="fused")
            torch.cuda.synchronize()
    (fw0,) = [e.device_time_total / e.count for e in prof.key_averages() if "fused_" in e.key]
    print(
        f"{cellf} {NH}x{D} B={B} T={T:5d}  fw kernel {ev.get('fw', 0):9.1f} us"
        f"  bw kernel {ev.get('bw', 0):9.1f} us  fw kernel (no grad) {fw0:9.1f} us",
        flush=True,
    )
