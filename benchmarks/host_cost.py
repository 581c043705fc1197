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
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_speed import calls, prepare  # the same problems' calls as the A/B

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
        prepare(cells[c], nh, d, b)
    for c, nh, d, b in PROBLEMS:
        fw, fwbw = calls(cells[c], nh, d, b, T)
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
