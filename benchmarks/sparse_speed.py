"""A sparse R: rnncc's sparse kernel (grid_sparse, bf16, a random mask) beside rnncc's own
dense path (no mask) and ``nn.LSTM``/``nn.GRU`` (cuDNN, fp16, dense) in one process, one
head, T = 1024, forward and forward + backward (ms, median of REPEATS). Each record carries
``density`` (1.0: dense) and says in ``note`` which rnncc variant ran.

    python benchmarks/sparse_speed.py --out benchmarks/results/sparse-h100-DATE.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import rnncc  # noqa: E402
from rnncc.bench.records import Record, machine_info  # noqa: E402
from rnncc.bench.timing import cuda_timer  # noqa: E402

T, REPEATS = 1024, 5
#: (cell, hidden, batch, density)
POINTS = [
    ("lstm", 2304, 4, 0.3),
    ("lstm", 2304, 4, 0.1),
    ("gru", 2304, 4, 0.3),
    ("lstm", 2048, 16, 0.3),
    ("lstm", 3840, 4, 0.1),
    ("lstm", 3960, 4, 0.1),  # the largest a random 10 % mask fits in shared memory alone
    ("lstm", 5280, 4, 0.1),  # 2.5 times the dense on-chip limit: entries in registers as well
]


def median_ms(fn) -> float:
    for _ in range(2):
        fn()
    return statistics.median(cuda_timer(fn) for _ in range(REPEATS))


def rnncc_record(cell, name: str, H: int, B: int, density: float) -> dict:
    g = torch.Generator(device="cuda").manual_seed(0)
    s = cell.shapes(B, T, 1, H)
    Wx = torch.randn(s["Wx"], generator=g, device="cuda").bfloat16().requires_grad_()
    R = (torch.randn(s["R"], generator=g, device="cuda") * H**-0.5).bfloat16().requires_grad_()
    b = (torch.randn(s["b"], generator=g, device="cuda") * 0.1).bfloat16().requires_grad_()
    mask = torch.rand(s["R"], generator=g, device="cuda") < density if density < 1 else None

    def fw():
        with torch.no_grad():
            cell(Wx, R, b, mask=mask)

    def fwbw():
        cell(Wx, R, b, mask=mask)[0].float().sum().backward()

    rec = Record("rnncc-fused", name, "bf16", B, T, 1, H, repeats=REPEATS)
    rec.fw_ms = round(median_ms(fw), 3)
    plan = cell.last_plan
    rec.fwbw_ms = round(median_ms(fwbw), 3)
    rec.note = plan.variant if plan is not None else cell.last_backend
    return {**rec.as_dict(), "density": density}


def cudnn_record(name: str, H: int, B: int) -> dict:
    cls = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[name]
    m = cls(H, H, batch_first=True).cuda().half()
    x = torch.randn(B, T, H, device="cuda", dtype=torch.float16, requires_grad=True)

    def fw():
        with torch.no_grad():
            m(x)

    def fwbw():
        m(x)[0].float().sum().backward()

    rec = Record("cudnn", name, "fp16", B, T, 1, H, repeats=REPEATS)
    rec.fw_ms, rec.fwbw_ms = round(median_ms(fw), 3), round(median_ms(fwbw), 3)
    rec.note = f"torch.nn.{cls.__name__} (cuDNN {torch.backends.cudnn.version()}), dense"
    return {**rec.as_dict(), "density": 1.0}


def _points(items: list[str]) -> list[tuple[str, int, int, float]]:
    points = []
    for item in items:
        parts = item.split(":")
        try:
            name, H, B, density = parts[0], int(parts[1]), int(parts[2]), float(parts[3])
        except (IndexError, ValueError):
            raise SystemExit(
                f"--point {item!r}: expected CELL:HIDDEN:BATCH:DENSITY, e.g. lstm:5280:4:0.1"
            ) from None
        if name not in ("lstm", "gru") or len(parts) != 4 or not 0 < density < 1:
            raise SystemExit(f"--point {item!r}: the cell is lstm or gru, the density in (0, 1)")
        points.append((name, H, B, density))
    return points


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--points", type=int, default=len(POINTS), help="the first N points only")
    ap.add_argument(
        "--point",
        action="append",
        metavar="CELL:HIDDEN:BATCH:DENSITY",
        help="run these points instead (repeatable), e.g. lstm:5280:4:0.1",
    )
    ap.add_argument(
        "--sparse-only", action="store_true", help="only rnncc's masked runs (no dense, no cuDNN)"
    )
    args = ap.parse_args()
    cells = {n: rnncc.load(ROOT / "examples" / f"{n}.rnn") for n in ("lstm", "gru")}
    records: list[dict] = []
    for name, H, B, density in _points(args.point) if args.point else POINTS[: args.points]:
        for density_or_cudnn in (density,) if args.sparse_only else (density, 1.0, None):
            if density_or_cudnn is None:
                rec = cudnn_record(name, H, B)
            else:
                rec = rnncc_record(cells[name], name, H, B, density_or_cudnn)
            records.append(rec)
            print(
                f"{name} {H} B{B} density {rec['density']:.2f} {rec['system']:12s} "
                f"fw {rec['fw_ms']:8.2f} fwbw {rec['fwbw_ms']:8.2f} ms  {rec['note']}",
                flush=True,
            )
        if args.out:  # the records' schema plus density (rnncc.bench.records.Record)
            data = {"machine": machine_info(torch.device("cuda")), "records": records}
            Path(args.out).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
