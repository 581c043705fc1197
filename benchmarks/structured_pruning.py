"""What a tensor-core sparsity pattern of R costs in accuracy, against unstructured magnitude
pruning: each pattern's mask is cut from the same dense-trained LSTM (examples/
prune_finetune.py's bracket-depth task and model, on the CPU), then fine-tuned the same number
of steps from the same state. Per pattern: the kept fraction of R, the fraction of R's squared
magnitude kept, and the test accuracy right after pruning and after fine-tuning, over seeds.

    python benchmarks/structured_pruning.py --json benchmarks/results/structured-pruning-cpu-DATE.json

The patterns: ``mma.sp`` (sparse tensor cores, Ampere and Hopper) needs 2:4 along the
reduction dimension, the columns of R (in each row, at most 2 non-zeros in each group of 4
consecutive columns), so 50 %; a lower density needs whole blocks dropped on top (16 × 16, or
1 × 16 segments of a row), with 2:4 inside the kept ones. rnncc's ``grid_sparse`` takes any
mask: it runs on the CUDA cores.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import io
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rnncc.bench.records import machine_info  # noqa: E402
from rnncc.runtime.sparsity import magnitude_mask  # noqa: E402


def _example():
    spec = importlib.util.spec_from_file_location(
        "prune_finetune", ROOT / "examples" / "prune_finetune.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


example = _example()

#: The example's tiny configuration made harder: twice the units (so that a gate of R holds
#: 16 blocks of 16 × 16), strings twice as long, fewer dense and fine-tuning steps.
CONFIG = dict(
    hidden=64, embed=16, seq_len=48, batch=64, steps=400, finetune_steps=60, lr=1e-2, seeds=3
)


# ---- masks: each takes R [G, NH, D, D] (row: output unit, column: input unit) --------------
def two_four(R: torch.Tensor) -> torch.Tensor:
    """2:4 along the reduction dimension: in each row, the 2 largest ``|R|`` of each group of 4
    consecutive columns."""
    G, NH, D, _ = R.shape
    groups = R.detach().abs().reshape(G, NH, D, D // 4, 4)
    mask = torch.zeros_like(groups, dtype=torch.bool)
    mask.scatter_(-1, groups.topk(2, dim=-1).indices, True)
    return mask.view(G, NH, D, D)


def blocks(R: torch.Tensor, density: float, rows: int, cols: int) -> torch.Tensor:
    """The ``ceil(density × blocks)`` blocks of ``rows × cols`` of largest squared norm of each
    (gate, head), every entry in them kept."""
    G, NH, D, _ = R.shape
    tiles = R.detach().reshape(G, NH, D // rows, rows, D // cols, cols).square().sum((3, 5))
    flat = tiles.reshape(G, NH, -1)
    keep = torch.zeros_like(flat, dtype=torch.bool)
    keep.scatter_(-1, flat.topk(math.ceil(density * flat.shape[-1]), dim=-1).indices, True)
    keep = keep.view(G, NH, D // rows, 1, D // cols, 1)
    return keep.expand(G, NH, D // rows, rows, D // cols, cols).reshape(G, NH, D, D)


def blocks_two_four(R: torch.Tensor, density: float, rows: int, cols: int) -> torch.Tensor:
    """2:4 inside the blocks kept by ``blocks``; the blocks are ranked by what 2:4 leaves of
    them, which keeps the most squared magnitude this pattern can."""
    inner = two_four(R)
    return inner & blocks(R * inner, density, rows, cols)


#: name → mask of R. 0.6 of the blocks with 2:4 inside keeps 0.6 × 0.5 = 30 %.
PATTERNS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "dense (no mask)": lambda R: torch.ones_like(R, dtype=torch.bool),
    "unstructured 50 %": lambda R: magnitude_mask(R, 0.5),
    "2:4 (50 %)": two_four,
    "unstructured 30 %": lambda R: magnitude_mask(R, 0.3),
    "16x16 blocks 30 %": lambda R: blocks(R, 0.3, 16, 16),
    "16x16 blocks 60 % + 2:4": lambda R: blocks_two_four(R, 0.6, 16, 16),
    "1x16 segments 30 %": lambda R: blocks(R, 0.3, 1, 16),
    "1x16 segments 60 % + 2:4": lambda R: blocks_two_four(R, 0.6, 1, 16),
}


def run_seed(seed: int, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Train one dense model from ``seed``, then cut and fine-tune every pattern from it."""
    tokens, depths = example.brackets(example.TRAIN + example.TEST, args.seq_len, seed)
    train_set = (tokens[: example.TRAIN], depths[: example.TRAIN])
    test_set = (tokens[example.TRAIN :], depths[example.TRAIN :])
    # train() prints the test accuracy on the way; a slice of the test set is enough for that.
    progress = (*train_set, *(t[:256] for t in test_set))
    torch.manual_seed(seed)
    dense = example.DepthModel(args.hidden, args.embed)
    started = time.perf_counter()
    example.train(dense, progress, args.steps, args, f"seed {seed} dense", seed + 1)
    print(f"  seed {seed}: dense training {time.perf_counter() - started:.1f} s", flush=True)

    results = {}
    for name, pattern in PATTERNS.items():
        model = copy.deepcopy(dense)
        Rs = [w.R.detach() for w in model.rnn.weights]
        masks = [pattern(R) for R in Rs]
        energy = sum(float(R.square().sum()) for R in Rs)
        kept_energy = sum(float((R * m).square().sum()) for R, m in zip(Rs, masks, strict=True))
        model.rnn.set_masks_(masks)
        before = example.accuracy(model, *test_set, args.batch)
        with contextlib.redirect_stdout(io.StringIO()):
            example.train(model, progress, args.finetune_steps, args, name, seed + 2)
        results[name] = {
            "kept_fraction": sum(int(m.sum()) for m in masks) / sum(m.numel() for m in masks),
            "kept_energy": kept_energy / energy,
            "accuracy_pruned": before,
            "accuracy_finetuned": example.accuracy(model, *test_set, args.batch),
        }
        r = results[name]
        print(
            f"  seed {seed} {name:26s} after pruning {r['accuracy_pruned']:6.2f} %, "
            f"fine-tuned {r['accuracy_finetuned']:6.2f} %",
            flush=True,
        )
    return results


def summary(runs: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, list[float]]]:
    """Per pattern and number: mean, min and max over the seeds."""
    out: dict[str, dict[str, list[float]]] = {}
    for name in PATTERNS:
        out[name] = {}
        for key in runs[0][name]:
            values = [run[name][key] for run in runs]
            out[name][key] = [statistics.fmean(values), min(values), max(values)]
    return out


def table(stats: dict[str, dict[str, list[float]]], seeds: int) -> str:
    def acc(v: list[float]) -> str:
        return f"{v[0]:6.2f} ({v[1]:6.2f} – {v[2]:6.2f})"

    lines = [
        f"test accuracy (%): mean (min – max) over {seeds} seed{'s' * (seeds > 1)}",
        f"{'pattern':26s} {'kept':>6s} {'|R|² kept':>10s}  {'after pruning':>24s}  "
        f"{'after fine-tuning':>24s}",
    ]
    for name, s in stats.items():
        lines.append(
            f"{name:26s} {s['kept_fraction'][0]:6.1%} {s['kept_energy'][0]:10.1%}  "
            f"{acc(s['accuracy_pruned']):>24s}  {acc(s['accuracy_finetuned']):>24s}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, value in CONFIG.items():
        parser.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    parser.add_argument("--json", metavar="PATH", help="write the results here as JSON")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # tensors this small gain nothing from threads
    print(
        f"hidden {args.hidden}, strings of {args.seq_len} tokens, batch {args.batch}, "
        f"{args.steps} dense steps, {args.finetune_steps} fine-tuning steps per pattern"
    )
    started = time.perf_counter()
    runs = [run_seed(seed, args) for seed in range(args.seeds)]
    seconds = time.perf_counter() - started
    stats = summary(runs)
    print(table(stats, args.seeds))
    print(f"{seconds:.0f} s in all")
    if args.json:
        results = {
            "machine": machine_info("cpu"),
            "task": "bracket depth at the end of the string (examples/prune_finetune.py)",
            **{name: getattr(args, name) for name in CONFIG},
            "seconds": seconds,
            "summary": {"fields": "mean, min, max over seeds", **stats},
            "runs": runs,
        }
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
