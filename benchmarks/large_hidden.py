"""Hidden sizes up to 4096: rnncc (fused where a fused variant runs the size, else stepwise)
beside ``nn.LSTM``/``nn.GRU`` (cuDNN, fp16) in one process, T = 1024, one head, bf16, forward
and forward + backward. Points:

- LSTM, B = 16, hidden 256 … 4096 (the plot's sweep);
- LSTM at 2304 and 4096 with B = 4 (the sizes of the beyond-1024 issue), and at 2048 with
  B = 4, 16, 64 (a batch sweep);
- GRU and sLSTM at 2048, B = 16, and at 4096, B = 4 (sLSTM has no cuDNN kernel: compare it
  with the LSTM's); the LSTM at 3072, B = 4.

Every record says which rnncc variant ran (``note``). ``--plot FILE.json`` draws time against
hidden size from a results file (CPU side: the GPU machine has no matplotlib).

    python benchmarks/large_hidden.py --out benchmarks/results/large-hidden-h100-DATE.json
    python benchmarks/large_hidden.py --plot benchmarks/results/large-hidden-h100-DATE.json
    python benchmarks/large_hidden.py --out FILE.json --points gru:2048:16,lstm:2048:16
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SWEEP = (256, 512, 768, 1024, 1536, 2048, 2304, 3072, 4096)
#: (cell, hidden, batch) beyond the B = 16 LSTM sweep
POINTS = [
    ("lstm", 2304, 4),
    ("lstm", 4096, 4),
    ("lstm", 2048, 4),
    ("lstm", 2048, 64),
    ("gru", 2048, 16),
    ("slstm", 2048, 16),
    ("lstm", 3072, 4),
    ("gru", 4096, 4),
    ("slstm", 4096, 4),
]
T = 1024


def parse_points(text: str) -> list[tuple[str, int, int]]:
    """``CELL:HIDDEN:B,...`` as (cell, hidden, batch) points."""
    points = []
    for item in text.split(","):
        parts = item.split(":")
        if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
            raise SystemExit(f"--points: {item!r} is not CELL:HIDDEN:B (e.g. gru:2048:16)")
        points.append((parts[0], int(parts[1]), int(parts[2])))
    return points


def measure(out: Path, repeats: int, only: list[tuple[str, int, int]] | None = None) -> None:
    import torch

    import rnncc
    from rnncc.bench.command import Settings, run_system
    from rnncc.bench.records import machine_info, write_results
    from rnncc.bench.workloads import Case

    points = only or [("lstm", h, 16) for h in SWEEP] + POINTS
    cells = {n: rnncc.load(ROOT / "examples" / f"{n}.rnn") for n in {p[0] for p in points}}
    device = torch.device("cuda")

    def backend(name: str, hidden: int, batch: int) -> str:
        plan = cells[name].plan(batch, 1, hidden, torch.bfloat16, device=device)
        return "fused" if plan.fused else "stepwise"

    # Every library the points run, built in parallel up front.
    def prepare(p: tuple[str, int, int]) -> None:
        name, hidden, batch = p
        cells[name].prepare(device, head_dim=hidden, dtype=torch.bfloat16, batch=batch)

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(prepare, points))
    settings = Settings(fwbw=True, warmup=2, repeats=repeats)
    records = []
    for name, hidden, batch in points:
        case = Case(name, batch, T, 1, hidden, "bf16")
        b = backend(name, hidden, batch)
        rec = run_system(f"rnncc-{b}", cells[name], case, device=device, settings=settings)
        ran = cells[name].last_plan
        for r in rec:
            r.note = ran.variant if ran is not None else b
        base = {"lstm": "lstm", "gru": "gru"}.get(name)
        rec += run_system(
            "cudnn",
            cells[name],
            case,
            device=device,
            settings=settings,
            baseline=base,
            cudnn_dtypes=("fp16",),
        )
        for r in rec:
            fw = "—" if r.fw_ms is None else f"{r.fw_ms:.2f}"
            fwbw = "—" if r.fwbw_ms is None else f"{r.fwbw_ms:.2f}"
            print(f"{name} {hidden} B{batch} {r.system} {r.dtype}: {fw} / {fwbw} ms {r.note}")
        records += rec
        write_results(out, machine_info(device), records)


def plot(results: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(results.read_text())["records"]
    sweep = [r for r in data if r["cell"] == "lstm" and r["B"] == 16 and r["status"] == "ok"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharex=True)
    for ax, key, title in zip(axes, ("fw_ms", "fwbw_ms"), ("forward", "forward + backward")):
        for system in ("rnncc", "cudnn"):
            rows = sorted(
                (r["D"], r[key], r["note"]) for r in sweep if r["system"].startswith(system)
            )
            label = "rnncc (bf16)" if system == "rnncc" else "cuDNN nn.LSTM (fp16)"
            ax.plot([r[0] for r in rows], [r[1] for r in rows], marker="o", label=label)
            if system == "rnncc":
                for d, ms, note in rows:
                    ax.annotate(note, (d, ms), fontsize=6, rotation=30)
        ax.set_title(f"LSTM, B = 16, T = {T}: {title}")
        ax.set_xlabel("hidden size (one head)")
        ax.set_ylabel("ms")
        ax.set_yscale("log")
        ax.legend()
    fig.tight_layout()
    png = results.with_suffix(".png")
    fig.savefig(png, dpi=120)
    return png


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--plot", type=Path, help="draw the plot of a results file")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument(
        "--points", help="only these points, CELL:HIDDEN:B,... (default: the sweep and POINTS)"
    )
    args = ap.parse_args()
    if args.plot:
        print(plot(args.plot))
    elif args.out:
        measure(args.out, args.repeats, parse_points(args.points) if args.points else None)
    else:
        sys.exit("give --out or --plot")


if __name__ == "__main__":
    main()
