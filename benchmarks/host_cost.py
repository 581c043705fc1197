"""The host's cost of short cell calls: calls whose kernels take less time than the Python and
C++ work around them, timed back to back (200 calls without a synchronisation between them, so
a call's time is its host work, best of five), for one rnncc tree (``PYTHONPATH``); run it for
two trees, alternating, to compare them (``ab_speed.py`` times single calls, whose fixed host
time before the launch shows up there too). LSTM 48 × 16 and GRU 24 × 32, B = 16, T = 64,
bf16: ``fw`` under no_grad, ``fwbw`` forward + ``.sum().backward()``. ``--profile`` adds the
top of a cProfile of 200 training calls. Uses only ``rnncc.load``, ``prepare`` and the cell
call, so any tree since the fused backend runs it.

    PYTHONPATH=old python benchmarks/host_cost.py --label old
    PYTHONPATH=.   python benchmarks/host_cost.py --label new --profile
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
PROBLEMS = [("lstm", 48, 16, 16), ("gru", 24, 32, 16)]  # (cell, NH, D, B)
T, CALLS, ROUNDS = 64, 200, 5


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--label", default="rnncc", help="printed before each line")
    ap.add_argument("--examples", type=Path, default=EXAMPLES, help="the tree's examples/")
    ap.add_argument("--profile", action="store_true", help="cProfile 200 training calls")
    args = ap.parse_args()
    import torch

    import rnncc

    cells = {c: rnncc.load(args.examples / f"{c}.rnn") for c in {p[0] for p in PROBLEMS}}
    for c, nh, d, b in PROBLEMS:
        try:
            cells[c].prepare("cuda", head_dim=d, dtype=torch.bfloat16, batch=b, heads=nh)
        except TypeError:  # a tree before plans: prepare(device, head_dim)
            cells[c].prepare("cuda", head_dim=d)
    for c, nh, d, b in PROBLEMS:
        cell = cells[c]
        g = torch.Generator(device="cuda").manual_seed(0)
        shapes = cell.shapes(b, T, nh, d)
        x = {
            k: None
            if shapes[k] is None
            else (0.5 * torch.randn(shapes[k], generator=g, device="cuda")).bfloat16()
            for k in ("Wx", "R", "b")
        }
        leaves = {k: v.clone().requires_grad_() for k, v in x.items() if v is not None}

        def fw(cell=cell, x=x):
            with torch.no_grad():
                cell(x["Wx"], x["R"], x["b"], backend="fused")

        def fwbw(cell=cell, leaves=leaves):
            for v in leaves.values():
                v.grad = None
            y, last = cell(leaves["Wx"], leaves.get("R"), leaves.get("b"), backend="fused")
            (y.float().sum() + last.float().sum()).backward()

        out = []
        for name, fn in (("fw", fw), ("fwbw", fwbw)):
            for _ in range(20):
                fn()
            best = float("inf")
            for _ in range(ROUNDS):
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(CALLS):
                    fn()
                torch.cuda.synchronize()
                best = min(best, (time.perf_counter() - start) / CALLS * 1e6)
            out.append(f"{name} {best:.1f} us")
        print(
            f"[{args.label}] {c} {nh}x{d} B{b} T{T} back-to-back, best of {ROUNDS} x {CALLS}: "
            + ", ".join(out),
            flush=True,
        )
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(CALLS):
                fwbw()
            prof.disable()
            torch.cuda.synchronize()
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
            print("\n".join(line for line in text.getvalue().splitlines() if line.strip()))


if __name__ == "__main__":
    main()
