"""Stacked and bidirectional layers, padded and packed: ``rnncc.RNN`` (fused, bf16) beside
``nn.LSTM`` (cuDNN, fp16) in one process, forward and forward + backward, hidden 768, B = 16,
T = 1024, input size 768. rnncc runs one head (the same model as nn.LSTM) and 12 heads.
The packed batch has the lengths of the layer issue: 256 to 1024, mean near 693.

    python benchmarks/layer_speed.py --out benchmarks/results/layer-speed-h100-DATE.json
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
from torch.nn.utils.rnn import pack_padded_sequence

import rnncc
from rnncc.bench.records import Record, machine_info, write_results
from rnncc.bench.timing import cuda_timer

H, B, T, REPEATS = 768, 16, 1024, 7
#: (layers, bidirectional, packed): packed "in call" packs the input inside each timed call
#: (its backward, PyTorch's, copies once per time step: both systems pay it), "given" packs
#: it once before the timing, the input needing no gradient (the weights' gradients only).
CONFIGS = [
    (1, False, None),
    (2, False, None),
    (2, True, None),
    (2, True, "in call"),
    (2, True, "given"),
]


def lengths() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    out = torch.randint(256, T + 1, (B,), generator=g)
    out[0] = T
    return out


def median_ms(fn) -> float:
    for _ in range(2):
        fn()
    return statistics.median(cuda_timer(fn) for _ in range(REPEATS))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    args = ap.parse_args()
    cell = rnncc.load_builtin("lstm")
    lens = lengths()
    records = []
    for layers, bi, packed in CONFIGS:
        shape = f"{layers} layer{'s' if layers > 1 else ''}{' bidirectional' if bi else ''}"
        shape += (
            f", packed {packed} (lengths {int(lens.min())}-{T}, mean {lens.float().mean():.0f})"
            if packed
            else ""
        )
        systems = {
            "nn.LSTM (cuDNN fp16)": (
                torch.nn.LSTM(H, H, layers, batch_first=True, bidirectional=bi).cuda().half(),
                torch.float16,
            ),
            "rnncc.RNN (fused bf16, 1 head)": (
                rnncc.RNN(
                    cell,
                    H,
                    H,
                    layers,
                    bidirectional=bi,
                    backend="fused",
                    device="cuda",
                    dtype=torch.bfloat16,
                ),
                torch.bfloat16,
            ),
            "rnncc.RNN (fused bf16, 12 heads)": (
                rnncc.RNN(
                    cell,
                    H,
                    H,
                    layers,
                    num_heads=12,
                    bidirectional=bi,
                    backend="fused",
                    device="cuda",
                    dtype=torch.bfloat16,
                ),
                torch.bfloat16,
            ),
        }
        for name, (module, dtype) in systems.items():
            x = torch.randn(B, T, H, device="cuda", dtype=dtype, requires_grad=packed != "given")
            given = pack_padded_sequence(x, lens, batch_first=True, enforce_sorted=False)

            def inp(x=x, packed=packed, given=given):
                if packed == "in call":  # its autograd graph is per call
                    return pack_padded_sequence(x, lens, batch_first=True, enforce_sorted=False)
                return given if packed == "given" else x

            def fw(module=module, inp=inp):
                with torch.no_grad():
                    module(inp())

            def fwbw(module=module, inp=inp, packed=packed):
                out = module(inp())[0]
                (out.data if packed else out).float().sum().backward()

            rec = Record(
                name, "lstm", "fp16" if dtype == torch.float16 else "bf16", B, T, 1, H, note=shape
            )
            rec.fw_ms, rec.fwbw_ms, rec.repeats = (
                round(median_ms(fw), 3),
                round(median_ms(fwbw), 3),
                REPEATS,
            )
            records.append(rec)
            print(
                f"{shape:55s} {name:34s} fw {rec.fw_ms:8.2f} ms  fwbw {rec.fwbw_ms:8.2f} ms",
                flush=True,
            )
    if args.out:
        write_results(Path(args.out), machine_info(torch.device("cuda")), records)


if __name__ == "__main__":
    main()
