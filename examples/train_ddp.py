"""Train a 2-layer rnncc LSTM to compute the parity of bit strings, data-parallel.

    torchrun --nproc_per_node=2 examples/train_ddp.py              # GPUs (NCCL) or CPUs (gloo)
    python examples/train_ddp.py                                   # one process, no DDP

Each step, every rank draws its own random bit strings (seeded by step and rank), and the
model predicts the running parity after every bit; DistributedDataParallel averages the
gradients, so the ranks train one model on the global batch. Training stops once the final
parity of held-out strings of full length is predicted with the target accuracy; the script
prints the time that took. The model is unchanged rnncc: ``rnncc.RNN`` layers stacked.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import rnncc

EXAMPLES = Path(__file__).resolve().parent


class ParityModel(nn.Module):
    """Bits → two stacked rnncc layers → a parity logit per position."""

    def __init__(self, cell: str = "lstm", hidden: int = 64, backend: str = "auto"):
        super().__init__()
        compiled = rnncc.load(EXAMPLES / f"{cell}.rnn")
        self.layers = nn.ModuleList(
            [
                rnncc.RNN(compiled, 1, hidden, backend=backend),
            ]
        )
        # a cell may output more than h (peephole_lstm: h and c): output_size features
        self.layers.append(rnncc.RNN(compiled, self.layers[0].output_size, hidden, backend=backend))
        self.head = nn.Linear(self.layers[1].output_size, 1)

    def forward(self, bits: torch.Tensor) -> torch.Tensor:
        """``bits`` ``[B, T]`` of 0/1 → logits ``[B, T]`` of the parity of each prefix."""
        h = bits.unsqueeze(-1).to(self.head.weight.dtype)
        for layer in self.layers:
            h, _ = layer(h)
        return self.head(h).squeeze(-1)


def batch(
    size: int, length: int, *, seed: int, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random bit strings ``[size, length]`` and the parity of every prefix."""
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(0, 2, (size, length), generator=g)
    return bits.to(device), (bits.cumsum(1) % 2).to(device)


def setup() -> tuple[int, int, torch.device]:
    """Rank, world size and device; joins the process group when started by torchrun."""
    if "RANK" not in os.environ:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return 0, 1, device
    if torch.cuda.is_available():
        local = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        device = torch.device("cuda", local)
    else:
        dist.init_process_group("gloo")
        device = torch.device("cpu")
    return dist.get_rank(), dist.get_world_size(), device


def positive(text: str) -> int:
    """An argparse type: a count or size of at least 1 (with 0 steps or a 0 evaluation
    interval the run would end without an evaluation and report the target missed)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cell", default="lstm", help="an example cell (default lstm)")
    parser.add_argument("--length", type=positive, default=64, help="bits per string (default 64)")
    parser.add_argument("--hidden", type=positive, default=64)
    parser.add_argument("--batch", type=positive, default=128, help="strings per rank and step")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--steps", type=positive, default=3000, help="at most this many steps")
    parser.add_argument("--target", type=float, default=0.99, help="held-out accuracy to reach")
    parser.add_argument("--eval-every", type=positive, default=50)
    parser.add_argument("--backend", default="auto")
    args = parser.parse_args(argv)

    rank, world, device = setup()
    torch.manual_seed(0)  # the same initial weights on every rank
    model = ParityModel(args.cell, args.hidden, args.backend).to(device)
    if dist.is_initialized():
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = nn.BCEWithLogitsLoss()
    test_bits, test_parity = batch(4096, args.length, seed=-1 % 2**63, device=device)
    say = print if rank == 0 else (lambda *a, **k: None)
    say(
        f"{world} process(es) on {device.type}, {args.cell}, {args.length} bits, batch {args.batch}"
    )

    started = time.perf_counter()
    accuracy = 0.0
    for step in range(1, args.steps + 1):
        bits, parity = batch(args.batch, args.length, seed=step * world + rank, device=device)
        loss = loss_fn(model(bits), parity.float())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % args.eval_every == 0 or step == args.steps:  # the last step evaluates too
            with torch.no_grad():
                final = model(test_bits)[:, -1] > 0
            accuracy = (final == test_parity[:, -1].bool()).float().mean().item()
            seconds = time.perf_counter() - started
            say(
                f"step {step}: loss {loss.item():.4f}, held-out accuracy {accuracy:.4f} ({seconds:.1f} s)"
            )
            if accuracy >= args.target:
                break
    seconds = time.perf_counter() - started
    reached = accuracy >= args.target
    say(
        f"{'reached' if reached else 'did not reach'} {args.target:.0%} held-out accuracy "
        f"({accuracy:.4f}) after {step} steps, {seconds:.1f} s; backend {rnncc_backend(model)}"
    )
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0 if reached else 1


def rnncc_backend(model: nn.Module) -> str | None:
    """The backend the model's rnncc layers ran last."""
    layer = next(m for m in model.modules() if isinstance(m, rnncc.RNN))
    return layer.cell.last_backend


if __name__ == "__main__":
    raise SystemExit(main())
