"""Time the tiling solve for every case of shared/BENCHMARKS.md (target: ≤ 0.2 s each).

Cases: LSTM (Gr=4), bf16, the head-dim sweep (D, NH) ∈ {(16,48), (32,24), (64,12), (128,6),
(256,3), (768,1)} plus 1×256 and 1×1024, at batch 2..256; the sLSTM and GRU cells at B=16
and 64; the fp16 and fp32 anchors. Each case is solved ``--repeat`` times over every kernel
variant (nothing is kept between solves) and the median is reported with the plan chosen.

    python benchmarks/tiling_solve.py [--arch sm_90] [--repeat 3] [--json OUT]

(with rnncc importable: installed, or PYTHONPATH=. from the repository root). Wall and CPU
time are both reported: a shared machine inflates the first, not the second.

Non-goals: asserting the target (tests do not time anything); GPU timings.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from rnncc.tiling import Problem, caps_for_arch, solve

# Per-element pointwise cost of the example cells (rnncc.tiling.problem.pointwise_mix of
# rnncc.ir.op_counts for examples/{lstm,slstm,gru}.rnn), fixed here so that the benchmark
# does not depend on the front end.
CELLS = {
    "lstm": dict(gates_r=4, n_states=2, mufu_ops=8, alu_ops=10, cell_regs=7),
    "slstm": dict(gates_r=4, n_states=4, mufu_ops=8, alu_ops=23, cell_regs=10),
    "gru": dict(gates_r=3, n_states=1, mufu_ops=5, alu_ops=12, cell_regs=7),
}
SWEEP = [(16, 48), (32, 24), (64, 12), (128, 6), (256, 3), (768, 1), (256, 1), (1024, 1)]
BATCHES = [2, 8, 16, 32, 64, 128, 256]


def cases() -> list[tuple[str, str, int, int, int]]:
    out = [("lstm", "bf16", nh, d, b) for d, nh in SWEEP for b in BATCHES]
    out += [
        (cell, "bf16", nh, d, b)
        for cell in ("slstm", "gru")
        for d, nh in [(64, 12), (768, 1)]
        for b in (16, 64)
    ]
    out += [("lstm", "fp16", 1, d, b) for d, b in [(768, 16), (256, 16), (1024, 16), (768, 64)]]
    out += [("lstm", "fp32", 1, 768, 16)]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="write the timings as JSON here")
    args = ap.parse_args(argv)
    caps = caps_for_arch(args.arch)
    rows = []
    print(f"tiling solve on {caps.name} ({caps.arch}); median of {args.repeat}")
    print(f"{'cell':6} {'dtype':5} {'NH×D':>7} {'B':>4} {'wall ms':>8} {'cpu ms':>7}  plan")
    for cell, dtype, nh, d, b in cases():
        problem = Problem(heads=nh, head_dim=d, batch=b, dtype=dtype, **CELLS[cell])
        walls, cpus = [], []
        for _ in range(args.repeat):
            w0, c0 = time.perf_counter(), time.process_time()
            plan = solve(problem, caps)
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
        ms, cpu_ms = statistics.median(walls) * 1e3, statistics.median(cpus) * 1e3
        summary = f"{plan.summary()}; {plan.cost.forward_us:.2f}/{plan.cost.backward_us:.2f} µs"
        print(f"{cell:6} {dtype:5} {f'{nh}×{d}':>7} {b:>4} {ms:8.1f} {cpu_ms:7.1f}  {summary}")
        rows.append(
            dict(
                cell=cell,
                dtype=dtype,
                heads=nh,
                head_dim=d,
                batch=b,
                solve_ms=ms,
                solve_cpu_ms=cpu_ms,
                plan=plan.as_dict(),
            )
        )
    worst = max(r["solve_ms"] for r in rows)
    worst_cpu = max(r["solve_cpu_ms"] for r in rows)
    print(
        f"{len(rows)} cases; slowest solve {worst:.1f} ms wall, {worst_cpu:.1f} ms CPU "
        f"(target ≤ 200 ms)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=caps.name, rows=rows), f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
