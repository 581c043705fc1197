"""One LSTM time step on the GPU, wall time per step from Python and per step of a replayed
CUDA graph: rnncc's ``CompiledCell.step`` (fused, bf16) beside ``nn.LSTM`` with seq_len 1 and
``nn.LSTMCell`` (fp16, cuDNN), in one process. Hidden 768 as one head, B = 1 and 16, no_grad.

    python benchmarks/step_speed.py --out benchmarks/results/step-speed-h100-DATE.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import rnncc

H, STEPS = 768, 200


def per_step_ms(fn, steps: int = STEPS) -> float:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps * 1e3


def graphed_ms(fn, steps: int = 50) -> float:
    """Per step of ``steps`` calls captured in one CUDA graph, replayed."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(steps):
            fn()
    return per_step_ms(g.replay, 20) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    args = ap.parse_args()
    cell = rnncc.load(Path(__file__).resolve().parents[1] / "examples" / "lstm.rnn")
    records = []
    with torch.no_grad():
        for B in (1, 16):
            R = torch.randn(4, 1, H, H, device="cuda", dtype=torch.bfloat16) * 0.02
            b = torch.zeros(4, 1, H, device="cuda", dtype=torch.bfloat16)
            wx = torch.randn(B, 4, 1, H, device="cuda", dtype=torch.bfloat16)
            st = [torch.zeros(2, B, 1, H, device="cuda", dtype=torch.bfloat16)]

            def rnncc_step(wx=wx, R=R, b=b, st=st):
                _, st[0] = cell.step(wx, R, b, st[0], backend="fused")

            lstm = torch.nn.LSTM(H, H, device="cuda", dtype=torch.float16)
            cellm = torch.nn.LSTMCell(H, H, device="cuda", dtype=torch.float16)
            x1 = torch.randn(1, B, H, device="cuda", dtype=torch.float16)
            hc = (torch.zeros(1, B, H, device="cuda", dtype=torch.float16),) * 2
            hc1 = (hc[0][0], hc[1][0])
            runs = {
                "rnncc step (fused, bf16)": rnncc_step,
                "nn.LSTM seq_len 1 (cuDNN fp16)": lambda m=lstm, x=x1, s=hc: m(x, s),
                "nn.LSTMCell (fp16)": lambda m=cellm, x=x1[0], s=hc1: m(x, s),
            }
            for name, fn in runs.items():
                wall, graph = per_step_ms(fn), graphed_ms(fn)
                records.append(
                    {
                        "system": name,
                        "cell": "lstm",
                        "B": B,
                        "T": 1,
                        "NH": 1,
                        "D": H,
                        "wall_ms": wall,
                        "graph_ms": graph,
                    }
                )
                print(
                    f"B={B:2d} {name:34s} wall {wall:.4f} ms/step  graph {graph:.4f} ms/step",
                    flush=True,
                )
    if args.out:
        machine = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
        Path(args.out).write_text(json.dumps({"machine": machine, "records": records}, indent=1))


if __name__ == "__main__":
    main()
