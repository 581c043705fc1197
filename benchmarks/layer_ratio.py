"""The layer issue's ratio: a 2-layer bidirectional LSTM's training step with ``rnncc.RNN``
(fused, bf16, one head) over ``nn.LSTM`` (cuDNN, fp16), in alternating rounds in one process.

cuDNN's time for this problem moves by a third between rounds of one process, so the ratio is
taken per round, rnncc and cuDNN timed back to back, over many rounds. Each round times, for
each system, the padded batch (the input needs a gradient) and the same batch packed before the
call (the lengths of ``layer_speed.py``, 278 to 1024; the input needs no gradient), two ways:

- one call: the median of 5 rnncc / 3 cuDNN calls, each with the device idle before it (the
  protocol of the README's tables: it includes the host's time to queue the first kernel);
- back to back: the mean of as many calls queued without waiting (a training loop: the host is
  ahead of the GPU).

A call is ``zero_grad``, the forward, ``out.float().sum().backward()`` (packed: ``out.data``).

    python benchmarks/layer_ratio.py --rounds 30 --out benchmarks/results/layer-ratio-KIND-DATE
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
from layer_speed import B, H, T, lengths
from torch.nn.utils.rnn import pack_padded_sequence

import rnncc
from rnncc.bench.records import Record, machine_info, write_results
from rnncc.bench.timing import cuda_timer

LAYERS = 2
INPUTS = ("padded", "packed before the call")


def systems() -> dict[str, tuple[torch.nn.Module, torch.dtype, int]]:
    """name: (module, input dtype, calls per round)."""
    cuda = torch.device("cuda")
    torch.manual_seed(0)
    ours = rnncc.RNN(
        rnncc.load_builtin("lstm"), H, H, LAYERS, bidirectional=True, backend="fused",
        device=cuda, dtype=torch.bfloat16,
    )  # fmt: skip
    theirs = torch.nn.LSTM(H, H, LAYERS, batch_first=True, bidirectional=True)
    return {
        "rnncc.RNN fused bf16": (ours, torch.bfloat16, 5),
        "torch.nn.LSTM cuDNN fp16": (theirs.to(cuda, torch.float16), torch.float16, 3),
    }


def step_fn(module: torch.nn.Module, dtype: torch.dtype, packed: bool):
    """One training step's call on a fixed input of this dtype."""
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(B, T, H, device="cuda", dtype=dtype, generator=g)
    if packed:
        inp = pack_padded_sequence(x, lengths(), batch_first=True, enforce_sorted=False)
    else:
        inp = x.requires_grad_()

    def call() -> None:
        module.zero_grad(set_to_none=True)
        x.grad = None
        out = module(inp)[0]
        (out.data if packed else out).float().sum().backward()

    return call


def back_to_back_ms(fn, n: int) -> float:
    """The mean time of ``n`` calls queued without waiting between them."""
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) / n


def summary(name: str, ratios: list[float]) -> str:
    under = sum(r <= 0.1 for r in ratios)
    return (
        f"# {name}: median {statistics.median(ratios):.3f}, range {min(ratios):.3f}-"
        f"{max(ratios):.3f}, rounds <= 0.100: {under}/{len(ratios)}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30, help="alternating rounds (default 30)")
    ap.add_argument("--out", help="write OUT.json (every call) and OUT.txt (the table)")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if not torch.cuda.is_available():
        ap.error("needs a CUDA device")
    calls = {
        (name, inp): (step_fn(m, dtype, inp != "padded"), n)
        for name, (m, dtype, n) in systems().items()
        for inp in INPUTS
    }
    for fn, _ in calls.values():  # builds, autotuning, cuDNN's plans
        for _ in range(3):
            fn()
    records: list[Record] = []
    lines = [
        f"# rnncc.RNN(lstm, {H}, {H}, {LAYERS} layers, bidirectional) fused bf16 against "
        f"nn.LSTM({H}, {H}, {LAYERS}, bidirectional) cuDNN fp16, B {B}, T {T}, fwbw; packed "
        f"before the call: lengths {int(lengths().min())}-{T}. one: the median of 5 rnncc / 3 "
        "cuDNN calls, each with the device idle before it; b2b: the mean of as many calls "
        "queued back to back. ms.",
        "round" + "".join(f"  {inp[:6]:>6}: rnncc one   b2b  cuDNN one   b2b  ratio one   b2b"
                          for inp in INPUTS),
    ]  # fmt: skip
    ratios: dict[tuple[str, str], list[float]] = {}
    spans: dict[tuple[str, str, str], list[float]] = {}
    for rnd in range(args.rounds):
        row = f"{rnd:5d}"
        for inp in INPUTS:
            times = {}
            for (name, i), (fn, n) in calls.items():
                if i != inp:
                    continue
                one = [cuda_timer(fn) for _ in range(n)]
                b2b = back_to_back_ms(fn, n)
                times[name] = (statistics.median(one), b2b)
                spans.setdefault((name, inp, "one"), []).append(times[name][0])
                spans.setdefault((name, inp, "b2b"), []).append(b2b)
                problem = {"num_layers": LAYERS, "bidirectional": True, "round": rnd,
                           "calls_ms": [round(t, 4) for t in one],
                           "back_to_back_fwbw_ms": round(b2b, 4)}  # fmt: skip
                if inp != "padded":
                    problem |= {"packed": inp, "lengths": lengths().tolist()}
                records.append(Record(
                    name, "lstm", "bf16" if "bf16" in name else "fp16", B, T, 1, H,
                    fwbw_ms=round(times[name][0], 4), repeats=n, problem=problem,
                ))  # fmt: skip
            (r1, r2), (c1, c2) = times["rnncc.RNN fused bf16"], times["torch.nn.LSTM cuDNN fp16"]
            ratios.setdefault((inp, "one"), []).append(r1 / c1)
            ratios.setdefault((inp, "b2b"), []).append(r2 / c2)
            row += f"  {r1:17.2f} {r2:5.2f} {c1:9.1f} {c2:5.1f} {r1 / c1:9.3f} {r2 / c2:5.3f}"
        print(row, flush=True)
        lines.append(row)
    for (inp, how), rs in ratios.items():
        lines.append(summary(f"ratio {inp}, {how}", rs))
    for (name, inp, how), ts in spans.items():
        lines.append(
            f"# {name} {inp}, {how}: {min(ts):.2f}-{max(ts):.2f} ms "
            f"(median {statistics.median(ts):.2f})"
        )
    machine = machine_info(torch.device("cuda"))
    lines.insert(0, "# " + ", ".join(f"{k} {v}" for k, v in machine.items()))
    print("\n".join(line for line in lines if line.startswith("# ")))
    if args.out:
        protocol = " ".join(" ".join((__doc__ or "").split("\n\n")[1:-1]).split())
        write_results(Path(args.out + ".json"), machine, records, protocol=protocol)
        Path(args.out + ".txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
