"""Where a training step of the layer issue's model spends the GPU's time: the kernels of one
call of ``rnncc.RNN(lstm, 768, 768, 2 layers, bidirectional)`` (fused, bf16, B 16, T 1024;
``zero_grad``, the forward, ``out.float().sum().backward()``), the third of three queued back to
back, from a CUDA-only profiler trace: each kernel's start (ms from the call's first kernel),
duration and stream, then the time by kernel name, the busy time of the union of the streams,
and the gaps where no kernel runs.

    python benchmarks/layer_timeline.py [--packed] [--min-us 6] > benchmarks/results/layer-timeline-KIND-DATE.txt
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from layer_ratio import step_fn
from layer_speed import H
from torch.profiler import ProfilerActivity, profile

import rnncc
from rnncc.bench.records import machine_info

CALLS = 3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--packed", action="store_true", help="the batch packed before the call")
    ap.add_argument("--min-us", type=float, default=6.0, help="list kernels this long or longer")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        ap.error("needs a CUDA device")
    torch.manual_seed(0)
    layer = rnncc.RNN(
        rnncc.load_builtin("lstm"), H, H, 2, bidirectional=True, backend="fused",
        device="cuda", dtype=torch.bfloat16,
    )  # fmt: skip
    call = step_fn(layer, torch.bfloat16, args.packed)

    for _ in range(5):  # builds, cuBLAS's plans
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            call()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    kernels = sorted(
        (e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")),
        key=lambda e: e["ts"],
    )  # fmt: skip
    if len(kernels) % CALLS:
        raise SystemExit(f"{len(kernels)} kernels in {CALLS} calls: the calls differ")
    last = kernels[len(kernels) // CALLS * (CALLS - 1) :]
    t0 = last[0]["ts"]
    info = machine_info(torch.device("cuda"))
    print(
        f"# {info['gpu']}, {info['clock_sm']}, torch {info['torch']}, rnncc {info['rnncc_commit']}"
    )
    print(f"# {'packed before the call' if args.packed else 'padded'}; ms from the call's start")
    print("#   start     ms  stream  kernel")
    for e in last:
        if e["dur"] >= args.min_us:
            stream = e.get("args", {}).get("stream")
            print(
                f"{(e['ts'] - t0) / 1e3:9.3f} {e['dur'] / 1e3:6.3f}  s{stream!s:5} {e['name'][:100]}"
            )
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in last)
    busy, gaps, (start, end) = 0.0, [], spans[0]
    for s, e in spans[1:]:
        if s > end:
            busy += end - start
            gaps.append((end - t0, s - end))
            start, end = s, e
        else:
            end = max(end, e)
    busy += end - start
    print(f"# the call: {(end - t0) / 1e3:.3f} ms from its first kernel's start to its last's end, "
          f"{busy / 1e3:.3f} ms with a kernel running")  # fmt: skip
    print(
        "# gaps over 3 us (ms from the start, us):",
        [(round(a / 1e3, 3), round(g, 1)) for a, g in gaps if g > 3],
    )
    by_name: dict[str, float] = {}
    for e in last:
        by_name[e["name"][:80]] = by_name.get(e["name"][:80], 0.0) + e["dur"]
    print("# ms by kernel:")
    for name, us in sorted(by_name.items(), key=lambda kv: -kv[1]):
        print(f"{us / 1e3:8.3f}  {name}")


if __name__ == "__main__":
    main()
