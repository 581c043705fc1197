"""Decoding, one time step at a time, under no_grad: ``rnncc.RNN.step`` (bf16, the decoding
kernel, the input projection included) beside ``nn.LSTM`` with seq_len 1 and ``nn.LSTMCell``
(cuDNN fp16), in one process. LSTM, hidden = input = 768 as one head, B = 1 and 16, one and two
layers. Two figures per system, per step (``fw_ms``, the ``note`` says which):

- eager: wall time per call from Python, back to back (the host's launch overhead included);
- graph: a decoding loop captured in one CUDA graph and replayed, each step's input computed
  from the last output (x_{t+1} = out_t W, a 768 × 768 product inside the loop), per step.

Each figure is the median of 7 rounds; a round times a configuration's systems in turn.

    python benchmarks/step_speed.py --out benchmarks/results/step-speed-h100-DATE.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

import rnncc
from rnncc.bench.records import Record, machine_info, write_results

H, CALLS, GRAPH_STEPS, REPEATS, WARMUP = 768, 300, 64, 7, 50


def per_call_ms(fns: list[Callable[[], object]]) -> list[float]:
    """Per function, the median over REPEATS rounds of the wall time per call of CALLS calls
    back to back. Each round times the functions in turn, so that a slow spell of the host
    (these calls are host-bound) falls on all of them alike, not on whichever ran first."""
    for fn in fns:
        for _ in range(WARMUP):
            fn()
    runs: list[list[float]] = [[] for _ in fns]
    for _ in range(REPEATS):
        for fn, run in zip(fns, runs, strict=True):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(CALLS):
                fn()
            torch.cuda.synchronize()
            run.append((time.perf_counter() - t0) / CALLS * 1e3)
    return [statistics.median(run) for run in runs]


def captured(step: Callable[[int], None]) -> torch.cuda.CUDAGraph:
    """GRAPH_STEPS calls of ``step(t)`` captured in one CUDA graph (after two on a side
    stream, as capture requires)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for t in range(2):
            step(t)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for t in range(GRAPH_STEPS):
            step(t)
    graph.replay()
    return graph


def systems(B: int, layers: int):
    """(name, dtype, eager call, graph step(t)) per system."""
    kw16 = {"device": "cuda", "dtype": torch.float16}
    kwbf = {"device": "cuda", "dtype": torch.bfloat16}
    w16, wbf = torch.randn(H, H, **kw16) * 0.03, torch.randn(H, H, **kwbf) * 0.03

    layer = rnncc.RNN(rnncc.load_builtin("lstm"), H, H, layers, **kwbf)
    x = torch.randn(B, H, **kwbf)
    s = [torch.zeros(2, layers, B, H, **kwbf) for _ in range(2)]  # alternate: new ≠ old
    out = torch.empty(B, H, **kwbf)

    def rnncc_step(t: int) -> None:
        layer.step(x, s[t % 2], out=(out, s[(t + 1) % 2]))
        torch.matmul(out, wbf, out=x)

    lstm = torch.nn.LSTM(H, H, layers, **kw16)
    x1 = torch.randn(1, B, H, **kw16)
    hc = [torch.zeros(layers, B, H, **kw16), torch.zeros(layers, B, H, **kw16)]

    def lstm_step(t: int) -> None:
        y, (h, c) = lstm(x1, (hc[0], hc[1]))
        hc[0].copy_(h)
        hc[1].copy_(c)
        torch.matmul(y[0], w16, out=x1[0])

    found = [
        (
            "rnncc.RNN.step (decoding kernel, bf16)",
            "bf16",
            lambda: layer.step(x, s[0], out=(out, s[1])),
            rnncc_step,
        ),
        ("nn.LSTM seq_len 1 (cuDNN fp16)", "fp16", lambda: lstm(x1, (hc[0], hc[1])), lstm_step),
    ]
    if layers == 1:
        cellm = torch.nn.LSTMCell(H, H, **kw16)
        xc = torch.randn(B, H, **kw16)
        hc1 = [torch.zeros(B, H, **kw16), torch.zeros(B, H, **kw16)]

        def cell_step(t: int) -> None:
            h, c = cellm(xc, (hc1[0], hc1[1]))
            hc1[0].copy_(h)
            hc1[1].copy_(c)
            torch.matmul(h, w16, out=xc)

        found.append(("nn.LSTMCell (fp16)", "fp16", lambda: cellm(xc, (hc1[0], hc1[1])), cell_step))
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    args = ap.parse_args()
    records = []
    with torch.no_grad():
        for layers in (1, 2):
            for B in (1, 16):
                found = systems(B, layers)
                eager = per_call_ms([call for _, _, call, _ in found])
                graphs = [captured(step) for _, _, _, step in found]
                graph = [ms / GRAPH_STEPS for ms in per_call_ms([g.replay for g in graphs])]
                for (name, dtype, _, _), times in zip(found, zip(eager, graph), strict=True):
                    for how, ms in zip(("eager", "graph"), times, strict=True):
                        note = f"{layers} layer{'s' if layers > 1 else ''}, {how}: " + (
                            "wall time per call from Python"
                            if how == "eager"
                            else "per step of a replayed CUDA graph of decoding with "
                            "feedback (x_{t+1} = out_t W)"
                        )
                        rec = Record(name, "lstm", dtype, B, 1, 1, H, fw_ms=round(ms, 5), note=note)
                        rec.repeats = REPEATS
                        records.append(rec)
                        print(
                            f"{note[:9]:9s} B={B:2d} {name:40s} {how:5s} {ms * 1e3:8.2f} us/step",
                            flush=True,
                        )
    if args.out:
        write_results(Path(args.out), machine_info(torch.device("cuda")), records)


if __name__ == "__main__":
    main()
