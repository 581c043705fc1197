"""Prune a trained LSTM's recurrent weights to 30 %, fine-tune it, and compare it with the
dense model: test accuracy, and the speed of the recurrent layer with and without its mask.

    python examples/prune_finetune.py                  # on a GPU: hidden 2304, bf16 autocast
    python examples/prune_finetune.py --small          # a tiny configuration (always on the CPU)
    python examples/prune_finetune.py --json out.json  # the results as data too

The task, made by the script from --seed: strings of brackets and filler letters, such as
``(a(b)(``, whose brackets never close below depth 0 nor open past depth 8; the label is the
nesting depth at the end (here 2). The model (an embedding, one ``rnncc.RNN`` layer of the
LSTM cell in examples/lstm.rnn, a linear head) learns from the depth after every position
and is scored on the depth at the end of held-out strings. Once trained, ``prune_(0.3)``
keeps the 30 % largest entries of each gate of R and zeroes the rest; fine-tuning trains the
kept entries only (the dropped ones get no gradient and stay zero). The goal: the pruned
model's accuracy within 1 point of the dense one's; ``--check`` exits 1 when it is missed.

On CUDA the layer runs the fused kernels under bf16 autocast, and the planner may give the
masked R the sparse kernel ``grid_sparse`` (it keeps only R's non-zeros on chip): the timing
prints the plan each layer ran. On the CPU everything runs the reference backend.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

import rnncc
from rnncc.bench.timing import cuda_timer, host_timer

EXAMPLES = Path(__file__).resolve().parent
#: Tokens: an opening and a closing bracket, then filler letters that leave the depth alone.
TOKENS = "()ab"
MAX_DEPTH = 8
TRAIN, TEST = 16384, 2048
#: The goal: the pruned model's test accuracy at most this many points below the dense one's.
GOAL_POINTS = 1.0

#: Defaults of the GPU run and of the tiny run (--small, and always on the CPU). The timing
#: shape of the GPU run is the README's sparse table's: batch 4, 1024 steps.
LARGE = dict(
    hidden=2304,
    embed=64,
    seq_len=64,
    batch=32,
    steps=1000,
    finetune_steps=300,
    lr=1e-3,
    time_batch=4,
    time_seq_len=1024,
)
SMALL = dict(
    hidden=32,
    embed=16,
    seq_len=24,
    batch=64,
    steps=600,
    finetune_steps=200,
    lr=1e-2,
    time_batch=64,
    time_seq_len=24,
)


def brackets(n: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` strings of ``length`` tokens (indices into ``TOKENS``) and the nesting depth after
    each token, both ``[n, length]``: each position opens, closes or holds a filler with equal
    chance, a bracket that would leave ``[0, MAX_DEPTH]`` becoming a filler."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n, length, generator=g)
    filler = torch.randint(2, len(TOKENS), (n, length), generator=g)
    depth = torch.zeros(n, dtype=torch.long)
    tokens, depths = [], []
    for t in range(length):
        opens = (u[:, t] < 1 / 3) & (depth < MAX_DEPTH)
        closes = (u[:, t] >= 1 / 3) & (u[:, t] < 2 / 3) & (depth > 0)
        tokens.append(torch.where(opens, 0, torch.where(closes, 1, filler[:, t])))
        depth = depth + opens.long() - closes.long()
        depths.append(depth)
    return torch.stack(tokens, 1), torch.stack(depths, 1)


class DepthModel(nn.Module):
    """Tokens ``[B, T]`` → an embedding → one rnncc LSTM layer → depth logits ``[B, T, 9]``."""

    def __init__(self, hidden: int, embed: int):
        super().__init__()
        self.embed = nn.Embedding(len(TOKENS), embed)
        self.rnn = rnncc.RNN(rnncc.load(EXAMPLES / "lstm.rnn"), embed, hidden)
        self.head = nn.Linear(hidden, MAX_DEPTH + 1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(tokens))
        return self.head(out)


def autocast(device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA (float32 master weights; the fused kernels run bf16); nothing on
    the CPU, where the reference backend runs the float32 weights as they are."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train(
    model: DepthModel,
    data: tuple[torch.Tensor, ...],
    steps: int,
    args: argparse.Namespace,
    label: str,
    seed: int,
) -> None:
    """``steps`` Adam steps on random batches of the training strings, the loss over every
    position, the learning rate decaying linearly (so that a phase does not end on a spike);
    prints the loss and the test accuracy a few times on the way."""
    x_train, y_train, x_test, y_test = data
    device = x_train.device
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    decay = torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.05, total_iters=steps)
    g = torch.Generator().manual_seed(seed)
    started = time.perf_counter()
    for step in range(1, steps + 1):
        model.train()
        rows = torch.randint(0, len(x_train), (args.batch,), generator=g).to(device)
        with autocast(device):
            logits = model(x_train[rows])
        loss = nn.functional.cross_entropy(logits.float().flatten(0, 1), y_train[rows].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        decay.step()
        if step % max(1, steps // 4) == 0 or step == steps:
            acc = accuracy(model, x_test, y_test, args.batch)
            print(
                f"  {label} step {step:4d}: loss {loss.item():.4f}, test accuracy {acc:6.2f} % "
                f"({time.perf_counter() - started:.1f} s)",
                flush=True,
            )


@torch.no_grad()
def accuracy(model: DepthModel, tokens: torch.Tensor, depths: torch.Tensor, batch: int) -> float:
    """Percent of strings whose depth at the end is predicted right; in batches of the
    training batch's size, so that the evaluation runs the training's plan."""
    model.eval()
    right = 0
    for i in range(0, len(tokens), batch):
        with autocast(tokens.device):
            logits = model(tokens[i : i + batch])
        right += int((logits[:, -1].argmax(-1) == depths[i : i + batch, -1]).sum())
    return 100.0 * right / len(tokens)


def median_ms(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """The median time of ``fn`` over ``repeats`` calls after two warm-up calls (which build
    or load the kernels): CUDA events on a GPU, the host clock on the CPU."""
    for _ in range(2):
        fn()
    timer = cuda_timer if device.type == "cuda" else host_timer
    return statistics.median(timer(fn) for _ in range(repeats))


def time_layer(rnn: rnncc.RNN, batch: int, seq_len: int, device: torch.device) -> dict:
    """The layer's forward and forward + backward times (ms) on random input, and the plan
    its forward ran (the variant, its one-line summary; "reference" and None on the CPU)."""
    x = torch.randn(batch, seq_len, rnn.input_size, device=device, requires_grad=True)
    repeats = 20 if device.type == "cuda" else 5

    def forward():
        with torch.no_grad(), autocast(device):
            rnn(x)

    def forward_backward():
        with autocast(device):
            out, _ = rnn(x)
        out.float().sum().backward()

    forward_ms = median_ms(forward, device, repeats)
    plan, variant = rnn.cell.last_plan, ran(rnn)
    result = {
        "forward_ms": forward_ms,
        "forward_backward_ms": median_ms(forward_backward, device, repeats),
        "variant": variant,
        "plan": plan.summary() if plan is not None else None,
    }
    if plan is not None and rnn.weights[0].R_mask is not None:
        # The one number of the mask the planner reads, and why the sparse kernel did not run
        # where it did not: the mask's non-zeros do not fit on chip, or a dense kernel on
        # R * mask is predicted faster.
        result["fullest_strip_density"] = plan.problem.density
        for other in plan.alternatives:
            if other.variant == "grid_sparse" and other.forward_us is None:
                result["grid_sparse"] = "ruled out by " + ", ".join(other.binding)
            elif other.variant == "grid_sparse":
                result["grid_sparse"] = (
                    f"predicted {other.forward_us:.2f} µs a step forward, {plan.variant} "
                    f"{plan.cost.forward_us:.2f}"
                )
    return result


def ran(rnn: rnncc.RNN) -> str:
    """The kernel variant of the layer's last call ("reference" on the CPU)."""
    plan = rnn.cell.last_plan
    return plan.variant if plan is not None else str(rnn.cell.last_backend)


def mask_report(rnn: rnncc.RNN) -> dict:
    """The kept fraction of R's entries, and whether every dropped entry of R is zero."""
    masks = [w.R_mask for w in rnn.weights]
    kept = sum(int(m.sum()) for m in masks) / sum(m.numel() for m in masks)
    zero = all(bool((w.R.detach()[~w.R_mask] == 0).all()) for w in rnn.weights)
    return {"kept_fraction": kept, "dropped_entries_zero": zero}


def positive_int(text: str) -> int:
    """An argparse type: a size or count of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite number above 0 (the learning rate)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (0.0 < value < math.inf):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def kept_fraction(text: str) -> float:
    """An argparse type: ``prune_``'s density, checked before the dense training runs."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a kept fraction in (0, 1], got {text!r}")
    return value


def device_arg(text: str) -> torch.device:
    """An argparse type: the CPU, or a CUDA device that is there."""
    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"must be cpu or cuda, got {text!r}") from None
    if device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"must be cpu or cuda, got {text!r}")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise argparse.ArgumentTypeError(f"{text!r}: CUDA is not available here")
        if device.index is not None and device.index >= count:
            raise argparse.ArgumentTypeError(f"{text!r}: this machine has {count} CUDA device(s)")
    return device


def output_file(text: str) -> Path:
    """An argparse type: a file the results can be written to at the end, checked before the
    training (which takes minutes) rather than after it."""
    path = Path(text)
    if not text:
        raise argparse.ArgumentTypeError("must name a file, got ''")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder, not a file to write")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: no folder {str(path.parent)!r} to write it in")
    if not os.access(path if path.exists() else path.parent, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text!r}: not writable")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cuda = torch.cuda.is_available()
    parser.add_argument(
        "--device", type=device_arg, default="cuda" if cuda else "cpu", help="cuda if there is one"
    )
    parser.add_argument("--small", action="store_true", help="the tiny configuration (CPU: always)")
    for name, kind, what in (
        ("hidden", positive_int, "LSTM units"),
        ("embed", positive_int, "embedding size, the layer's input"),
        ("seq_len", positive_int, "tokens per string"),
        ("batch", positive_int, "strings per training step"),
        ("steps", positive_int, "dense training steps"),
        ("finetune_steps", positive_int, "training steps after pruning"),
        ("lr", positive_float, "Adam's learning rate"),
        ("time_batch", positive_int, "batch of the timing"),
        ("time_seq_len", positive_int, "time steps of the timing"),
    ):
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, type=kind, help=f"{what} ({LARGE[name]}; tiny: {SMALL[name]})")
    parser.add_argument(
        "--density", type=kept_fraction, default=0.3, help="R's kept fraction (0.3)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--json", type=output_file, metavar="PATH", help="write the results here as JSON"
    )
    parser.add_argument(
        "--save", type=output_file, metavar="PATH", help="save the pruned model's state_dict here"
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when the goal is missed")
    args = parser.parse_args(argv)
    device = args.device
    small = args.small or device.type == "cpu"
    if device.type == "cpu":
        # Tensors this small gain nothing from threads, which slow down on a busy machine.
        torch.set_num_threads(1)
    for name, value in (SMALL if small else LARGE).items():
        if getattr(args, name) is None:
            setattr(args, name, value)

    print(
        f"{'tiny' if small else 'large'} configuration on {device}: hidden {args.hidden}, "
        f"strings of {args.seq_len} tokens, batch {args.batch}, "
        f"{'bf16 autocast' if device.type == 'cuda' else 'float32'}"
    )
    tokens, depths = brackets(TRAIN + TEST, args.seq_len, args.seed)
    shown = min(12, args.seq_len)
    start = "".join(TOKENS[t] for t in tokens[0, :shown])
    print(f"the first string starts {start}, depth {depths[0, shown - 1]} after it")
    data = tuple(
        t.to(device) for t in (tokens[:TRAIN], depths[:TRAIN], tokens[TRAIN:], depths[TRAIN:])
    )
    torch.manual_seed(args.seed)
    model = DepthModel(args.hidden, args.embed).to(device)

    started = time.perf_counter()
    print(f"dense training, {args.steps} steps")
    train(model, data, args.steps, args, "dense", args.seed + 1)
    dense_seconds = time.perf_counter() - started
    dense_variant = ran(model.rnn)
    dense_acc = accuracy(model, data[2], data[3], args.batch)
    dense = copy.deepcopy(model)

    model.rnn.prune_(args.density)
    pruned_acc = accuracy(model, data[2], data[3], args.batch)
    print(f"pruned to {args.density:.0%} of R: test accuracy {pruned_acc:.2f} % before fine-tuning")
    started = time.perf_counter()
    print(f"fine-tuning, {args.finetune_steps} steps")
    train(model, data, args.finetune_steps, args, "fine-tune", args.seed + 2)
    finetune_seconds = time.perf_counter() - started
    pruned_variant = ran(model.rnn)
    print(f"training ran {dense_variant} (dense) and {pruned_variant} (pruned)")
    finetuned_acc = accuracy(model, data[2], data[3], args.batch)
    mask = mask_report(model.rnn)
    gap = finetuned_acc - dense_acc
    met = gap >= -GOAL_POINTS
    print(
        f"R keeps {mask['kept_fraction']:.1%} of its entries; the dropped ones are "
        f"{'all' if mask['dropped_entries_zero'] else 'NOT all'} zero after fine-tuning"
    )
    print(f"test accuracy: dense {dense_acc:.2f} %, pruned and fine-tuned {finetuned_acc:.2f} %")
    print(
        f"goal (pruned within {GOAL_POINTS:g} point of dense): "
        f"{'met' if met else 'MISSED'} (pruned − dense: {gap:+.2f} points)"
    )

    print(f"recurrent layer alone, batch {args.time_batch}, {args.time_seq_len} steps:")
    timing = {"batch": args.time_batch, "seq_len": args.time_seq_len}
    for name, rnn in (("dense", dense.rnn), ("pruned", model.rnn)):
        t = timing[name] = time_layer(rnn, args.time_batch, args.time_seq_len, device)
        line = (
            f"  {name:6s} forward {t['forward_ms']:8.2f} ms, forward + backward "
            f"{t['forward_backward_ms']:8.2f} ms, {t['plan'] or t['variant']}"
        )
        if "fullest_strip_density" in t:
            line += f"\n         the mask's fullest strip keeps {t['fullest_strip_density']:.1%}"
        if t.get("grid_sparse"):
            line += f"; grid_sparse: {t['grid_sparse']}"
        print(line)

    if args.save:  # R_mask is in the state_dict: the checkpoint loads pruned
        torch.save(model.state_dict(), args.save)
    if args.json:
        results = {
            "device": str(device),
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "dtype": "bfloat16" if device.type == "cuda" else "float32",
            "hidden": args.hidden,
            "embed": args.embed,
            "seq_len": args.seq_len,
            "batch": args.batch,
            "steps": args.steps,
            "finetune_steps": args.finetune_steps,
            "lr": args.lr,
            "density": args.density,
            "seed": args.seed,
            "dense_accuracy": dense_acc,
            "pruned_accuracy_before_finetune": pruned_acc,
            "pruned_accuracy": finetuned_acc,
            "gap_points": gap,
            "goal_points": GOAL_POINTS,
            "goal_met": met,
            **mask,
            "seconds": {"dense_training": dense_seconds, "finetuning": finetune_seconds},
            "training_variant": {"dense": dense_variant, "pruned": pruned_variant},
            "timing": timing,
        }
        args.json.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return 1 if args.check and not met else 0


if __name__ == "__main__":
    raise SystemExit(main())
