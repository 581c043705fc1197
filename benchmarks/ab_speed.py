"""A/B speed of two rnncc trees on the benchmark suite's LSTM/GRU/sLSTM problems, one GPU.

Run it once per tree (``PYTHONPATH=<tree>``), each writing ``--out <label>.json``, then
``--compare A.json B.json`` prints the ratio per problem and fails (exit 1) where B is more than
``--tolerance`` slower than A. Only the public API is used (``rnncc.load``, the cell call with
``backend="fused"``, ``prepare``), so any tree since the fused backend works. Timing: CUDA
events, median of ``--repeats`` calls after warm-up, ``fw`` under no_grad, ``fwbw`` forward plus
``.sum().backward()`` — ``rnncc.bench``'s method, restated here so that the old tree needs
nothing new.

Between processes one tree's time for a problem moves by up to 5-9 % on the grid tier and
10-16 % on the block tier (H100, 2026-11-27, same calls one process apart), more than the 3 %
a comparison judges: run each tree several times, alternating, and compare the fastest runs
(``--compare a1.json,a2.json,... b1.json,...``); ``--shapes`` reruns a few problems.

    PYTHONPATH=old python benchmarks/ab_speed.py --out old.json
    PYTHONPATH=.   python benchmarks/ab_speed.py --out new.json
    python benchmarks/ab_speed.py --compare old.json new.json
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CELLS = ("lstm", "gru", "slstm")
#: (NH, D, B): the head-dim sweep at B = 16 and the batch sweep's ends at 12 × 64 and 1 × 768.
SHAPES = [(48, 16, 16), (24, 32, 16), (12, 64, 16), (6, 128, 16), (3, 256, 16), (1, 768, 16)]
SHAPES += [(12, 64, 64), (1, 768, 64), (1, 768, 2), (1, 768, 32)]
T = 1024  # --seq overrides


def _time(fn, repeats: int, warmup: int) -> float:
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def prepare(cell, nh: int, d: int, b: int) -> None:
    """Build (or load) ``cell``'s kernels for the problem, on any tree since the fused backend."""
    import torch

    try:
        cell.prepare("cuda", head_dim=d, dtype=torch.bfloat16, batch=b, heads=nh)
    except TypeError:  # a tree before plans: prepare(device, head_dim)
        cell.prepare("cuda", head_dim=d)


def calls(cell, nh: int, d: int, b: int, T: int):
    """``(fw, fwbw)``: the problem's forward under no_grad and its forward +
    ``.sum().backward()``, on fixed random bf16 inputs (R scaled by 1/√D)."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    shapes = cell.shapes(b, T, nh, d)
    x = {
        k: None
        if shapes[k] is None
        else (0.5 * torch.randn(shapes[k], generator=g, device="cuda")).bfloat16()
        for k in ("Wx", "R", "b")
    }
    if x["R"] is not None:
        x["R"] = x["R"] / d**0.5

    def fw():
        with torch.no_grad():
            cell(x["Wx"], x["R"], x["b"], backend="fused")

    leaves = {k: v.clone().requires_grad_() for k, v in x.items() if v is not None}

    def fwbw():
        for v in leaves.values():
            v.grad = None
        y, last = cell(leaves["Wx"], leaves.get("R"), leaves.get("b"), backend="fused")
        (y.float().sum() + last.float().sum()).backward()

    return fw, fwbw


def measure(
    repeats: int,
    warmup: int,
    cells: tuple[str, ...],
    T: int = T,
    problems: list[tuple[int, int, int]] = SHAPES,
    system: str = "rnncc",
) -> list[dict]:
    import torch

    import rnncc

    loaded = {c: rnncc.load(EXAMPLES / f"{c}.rnn") for c in cells}
    with ThreadPoolExecutor(max_workers=16) as pool:
        jobs = [(loaded[c], *s) for c in cells for s in problems]
        list(pool.map(lambda job: prepare(*job), jobs))
    # The GPU's clocks ramp up under load: keep it busy for a while before the first timing, so
    # that the first problems of a run are not measured at idle clocks.
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    end = time.perf_counter() + 3.0
    while time.perf_counter() < end:
        a @ a
    torch.cuda.synchronize()
    records = []
    for name in cells:
        cell = loaded[name]
        for nh, d, b in problems:
            fw, fwbw = calls(cell, nh, d, b, T)
            rec = {"system": system, "cell": name, "NH": nh, "D": d, "B": b, "T": T}
            rec |= {"dtype": "bf16", "status": "ok"}
            rec["fw_ms"] = _time(fw, repeats, warmup)
            rec["fwbw_ms"] = _time(fwbw, repeats, warmup)
            plan = getattr(cell, "last_plan", None)
            rec["plan"] = plan.summary() if plan is not None else None
            records.append(rec)
            print(
                f"{name} {nh}x{d} B{b}: fw {rec['fw_ms']:.3f} ms, fwbw {rec['fwbw_ms']:.3f} ms"
                + (f"  [{rec['plan']}]" if rec["plan"] else ""),
                flush=True,
            )
    return records


def _best(paths: str) -> dict[tuple, dict]:
    """The records of comma-separated result files, the fastest of each problem's runs (runs
    of both trees alternate, so a slow spell of the machine hits one run, not one tree)."""
    best: dict[tuple, dict] = {}
    for path in paths.split(","):
        data = json.loads(Path(path).read_text())
        for r in data["records"] if isinstance(data, dict) else data:
            key = (r["cell"], r["NH"], r["D"], r["B"])
            if key in best:
                r = {
                    **r,
                    "fw_ms": min(r["fw_ms"], best[key]["fw_ms"]),
                    "fwbw_ms": min(r["fwbw_ms"], best[key]["fwbw_ms"]),
                }
            best[key] = r
    return best


def compare(a_path: str, b_path: str, tolerance: float) -> int:
    a, b = _best(a_path), _best(b_path)
    worse = 0
    print(
        f"{'problem':<22} {'A fw':>8} {'B fw':>8} {'B/A':>6} {'A fwbw':>8} {'B fwbw':>8} {'B/A':>6}"
    )
    for key in a:
        if key not in b:
            continue
        ra, rb = a[key], b[key]
        fw, fwbw = rb["fw_ms"] / ra["fw_ms"], rb["fwbw_ms"] / ra["fwbw_ms"]
        flag = "  SLOWER" if max(fw, fwbw) > 1 + tolerance else ""
        worse += bool(flag)
        name = f"{key[0]} {key[1]}x{key[2]} B{key[3]}"
        print(
            f"{name:<22} {ra['fw_ms']:8.3f} {rb['fw_ms']:8.3f} {fw:6.3f} "
            f"{ra['fwbw_ms']:8.3f} {rb['fwbw_ms']:8.3f} {fwbw:6.3f}{flag}"
        )
    print(f"{worse} of {len(a)} problems more than {tolerance:.0%} slower in B")
    return 1 if worse else 0


def _problems(text: str) -> list[tuple[int, int, int]]:
    """``--shapes``: "6x128:16,1x768:2" → [(6, 128, 16), (1, 768, 2)]."""
    found = []
    for item in text.split(","):
        m = re.fullmatch(r"(\d+)x(\d+):(\d+)", item.strip())
        if m is None:
            raise argparse.ArgumentTypeError(f"{item!r} is not HEADSxDIM:BATCH (e.g. 6x128:16)")
        found.append((int(m[1]), int(m[2]), int(m[3])))
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the measurements here (JSON)")
    ap.add_argument(
        "--compare",
        nargs=2,
        metavar=("A", "B"),
        help="compare two outputs (each may be several files, comma-separated: the fastest run)",
    )
    ap.add_argument("--tolerance", type=float, default=0.03, help="allowed slowdown (0.03)")
    ap.add_argument("--system", default="rnncc", help="the records' system (e.g. the tree)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--cells", default=",".join(CELLS))
    ap.add_argument("--seq", type=int, default=T, help="sequence length (1: the host's cost)")
    ap.add_argument(
        "--shapes",
        type=_problems,
        help="only these problems: HEADSxDIM:BATCH, comma-separated (e.g. 6x128:16,1x768:2)",
    )
    args = ap.parse_args()
    if args.compare:
        return compare(*args.compare, args.tolerance)
    import torch

    if not torch.cuda.is_available():
        print("ab_speed.py: needs a CUDA device", file=sys.stderr)
        return 2
    shapes = args.shapes or SHAPES
    cells = tuple(args.cells.split(","))
    records = measure(args.repeats, args.warmup, cells, args.seq, shapes, args.system)
    if args.out:
        Path(args.out).write_text(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
