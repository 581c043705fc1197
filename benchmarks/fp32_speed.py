"""float32 past the block tier: rnncc's grid tier in fp32 (3xTF32 on the tensor cores) beside
rnncc's stepwise fp32 and ``nn.LSTM``/``nn.GRU`` in fp32 (cuDNN with TF32 allowed, PyTorch's
default, and with it off), one process, one head, T = 1024, forward and forward + backward;
with ``--accuracy``, also prints the error of each against the same model in float64.

    python benchmarks/fp32_speed.py --out benchmarks/results/fp32-speed-h100-DATE.json
    python benchmarks/fp32_speed.py --out FILE.json --points lstm:768:16 --accuracy
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from large_hidden import T, parse_points  # T = 1024; CELL:HIDDEN:B,... points

ROOT = Path(__file__).resolve().parents[1]
#: (cell, hidden, batch)
POINTS = [
    ("lstm", 128, 16),
    ("lstm", 256, 16),
    ("lstm", 512, 16),
    ("lstm", 768, 16),
    ("lstm", 1024, 16),
    ("lstm", 768, 4),
    ("lstm", 768, 64),
    ("gru", 768, 16),
    ("gru", 1024, 16),
]


def measure(repeats: int, points: list[tuple[str, int, int]]) -> list:
    import torch

    import rnncc
    from rnncc.bench.command import Settings, run_system
    from rnncc.bench.workloads import Case

    cells = {n: rnncc.load(ROOT / "examples" / f"{n}.rnn") for n in {p[0] for p in points}}
    device = torch.device("cuda")
    with ThreadPoolExecutor(max_workers=16) as pool:  # every library, built up front
        list(
            pool.map(
                lambda p: cells[p[0]].prepare(
                    device, head_dim=p[1], dtype=torch.float32, batch=p[2]
                ),
                points,
            )
        )
    settings = Settings(fwbw=True, warmup=2, repeats=repeats)
    records = []
    for name, hidden, batch in points:
        case = Case(name, batch, T, 1, hidden, "fp32")
        cell = cells[name]
        rec = []
        for backend in ("fused", "stepwise"):
            got = run_system(f"rnncc-{backend}", cell, case, device=device, settings=settings)
            ran = cell.last_plan
            for r in got:
                r.note = ran.variant if ran is not None else backend
            rec += got
        for tf32 in (True, False):
            torch.backends.cudnn.allow_tf32 = tf32
            got = run_system(
                "cudnn",
                cell,
                case,
                device=device,
                settings=settings,
                baseline=name,
                cudnn_dtypes=("fp32",),
            )
            for r in got:
                r.note = f"cudnn.allow_tf32={tf32}"
            rec += got
        torch.backends.cudnn.allow_tf32 = True
        for r in rec:
            fw = "—" if r.fw_ms is None else f"{r.fw_ms:.2f}"
            fwbw = "—" if r.fwbw_ms is None else f"{r.fwbw_ms:.2f}"
            print(f"{name} {hidden} B{batch} {r.system} {r.dtype}: {fw} / {fwbw} ms {r.note}")
        records += rec
    return records


def accuracy(hidden: int, batch: int, steps: int) -> dict[str, float]:
    """Relative error (‖y − y64‖ / ‖y64‖) of an LSTM's output over ``steps`` steps against the
    same model in float64: rnncc fused and stepwise in fp32, cuDNN fp32 with TF32 on and off."""
    import torch

    import rnncc
    from rnncc.testing import rel_err

    torch.manual_seed(0)
    model = torch.nn.LSTM(hidden, hidden, batch_first=True).cuda()
    x = torch.randn(batch, steps, hidden, device="cuda")
    with torch.no_grad():
        y64 = copy.deepcopy(model).double()(x.double())[0]
        errors = {}
        for tf32 in (True, False):
            torch.backends.cudnn.allow_tf32 = tf32
            errors[f"cudnn fp32, allow_tf32={tf32}"] = rel_err(model(x)[0], y64)
        torch.backends.cudnn.allow_tf32 = True
        for backend in ("fused", "stepwise"):
            ours = rnncc.RNN.from_torch(model, backend=backend)
            y = ours(x)[0]
            ran = ours.cell.last_plan
            errors[f"rnncc {backend} fp32 ({ran.variant if ran else backend})"] = rel_err(y, y64)
    return errors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--points", type=parse_points, help="CELL:HIDDEN:B,... (default: POINTS)")
    ap.add_argument("--accuracy", action="store_true", help="and the errors against float64")
    args = ap.parse_args()
    import torch

    from rnncc.bench.records import machine_info, write_results

    records = measure(args.repeats, args.points or POINTS)
    write_results(args.out, machine_info(torch.device("cuda")), records)
    if args.accuracy:
        errors = {f"lstm {h} B{b} T{s}": accuracy(h, b, s) for h, b, s in ((768, 16, 256),)}
        print(json.dumps(errors, indent=1))  # printed only: not timing records


if __name__ == "__main__":
    main()
