"""Run a compiled cell package on random data, forward and backward, and check it against the
float64 reference: the same layer, copied, run by the reference backend in float64 on the
CPU. For the LSTM, that reference is also checked against torch.nn.LSTM (float64, CPU).

    rnncc compile examples/lstm.rnn -o build/lstm_cell
    python examples/demo.py build/lstm_cell

Runs on the GPU when there is one (the kernels are built on first use, or loaded from the
cache), else on the CPU (the reference backend). Exits 1 when a result is off.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import sys
import time
from pathlib import Path

import torch

#: ‖a − b‖ / ‖b‖ allowed against the float64 reference: float32 storage and math on the GPU.
TOLERANCE = 1e-5


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def run(layer: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Outputs, last states and every parameter's gradient of one forward + backward."""
    out, last = layer(x)
    (out.square().mean() + last.square().mean()).backward()
    return (out, last, *(p.grad for p in layer.parameters()))


def main(package: str) -> int:
    path = Path(package).resolve()
    sys.path.insert(0, str(path.parent))
    pkg = importlib.import_module(path.name)
    cell = pkg.cell
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"loaded {cell!r} from {path}")

    torch.manual_seed(0)
    B, T, I, H = 4, 32, 16, 64
    layer = pkg.RNN(I, H, num_heads=1).to(device, torch.float32)
    reference = copy.deepcopy(layer).to("cpu", torch.float64)
    reference.backend = "reference"
    x = torch.randn(B, T, I, device=device)

    if device == "cuda":
        started = time.perf_counter()
        cell.prepare(device, head_dim=H, dtype=torch.float32, batch=B)
        print(
            f"CUDA kernels built or loaded from the cache in {time.perf_counter() - started:.1f} s"
        )
    started = time.perf_counter()
    results = run(layer, x)
    if device == "cuda":
        torch.cuda.synchronize()
    if cell.last_plan is not None:
        print(f"plan: {cell.last_plan.summary()}")
    print(
        f"backend {cell.last_backend} on {device}: outputs {tuple(results[0].shape)}, "
        f"last states {tuple(results[1].shape)}, forward + backward "
        f"{1e3 * (time.perf_counter() - started):.1f} ms (first call)"
    )
    expected = run(reference, x.to("cpu", torch.float64))
    names = ["outputs", "last states"] + [f"d {n}" for n, _ in layer.named_parameters()]
    errors = {n: rel_err(a, b) for n, a, b in zip(names, results, expected, strict=True)}
    print(
        "relative difference to the float64 reference: "
        + ", ".join(f"{n} {e:.1e}" for n, e in errors.items())
    )
    failed = [n for n, e in errors.items() if not e <= TOLERANCE]

    if cell.name == "lstm":  # the reference against torch's own LSTM, with the same weights
        lstm = reference.to_torch()  # a torch.nn.LSTM holding a copy of the layer's weights
        with torch.no_grad():
            out, _ = lstm(x.to("cpu", torch.float64))
        err = rel_err(expected[0], out)
        print(f"float64 reference against torch.nn.LSTM (float64): {err:.1e}")
        if not err <= 1e-12:
            failed.append("torch.nn.LSTM")
    if failed:
        print(f"MISMATCH beyond {TOLERANCE:g}: {', '.join(failed)}", file=sys.stderr)
        return 1
    print("ok")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The package folder; a .rnn file or any other path is a usage error naming what to pass."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "package", metavar="DIR", help="the package `rnncc compile FILE.rnn -o DIR` wrote"
    )
    args = parser.parse_args(argv)
    path = Path(args.package)
    if path.suffix == ".rnn":
        out = f"build/{path.stem}_cell"
        parser.error(
            f"{args.package} is a cell's source, not a compiled package: run "
            f"`rnncc compile {args.package} -o {out}` and pass {out}"
        )
    if not (path / "__init__.py").is_file():
        parser.error(
            f"{args.package} is not a compiled cell package (a folder with __init__.py, "
            "as `rnncc compile FILE.rnn -o DIR` writes)"
        )
    return args


if __name__ == "__main__":
    raise SystemExit(main(parse_args().package))
