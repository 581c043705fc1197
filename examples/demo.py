"""Run a compiled cell package on random data: forward, backward, and (for the LSTM) a check
against torch.nn.LSTM with the same weights.

    rnncc compile examples/lstm.rnn -o build/lstm_cell
    python examples/demo.py build/lstm_cell

Runs on the GPU when there is one (stepwise CUDA backend, built on first use), else on the
CPU (reference backend).
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

import torch


def main(package: str) -> int:
    path = Path(package).resolve()
    sys.path.insert(0, str(path.parent))
    pkg = importlib.import_module(path.name)
    cell = pkg.cell
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float32
    print(f"loaded {cell!r} from {path}")

    torch.manual_seed(0)
    B, T, I, H = 4, 32, 16, 64
    layer = pkg.RNN(I, H, num_heads=1).to(device, dtype)
    x = torch.randn(B, T, I, device=device, dtype=dtype)
    started = time.perf_counter()
    out, last = layer(x)
    (out.square().mean() + last.square().mean()).backward()
    if device == "cuda":
        torch.cuda.synchronize()
    print(
        f"backend {cell.last_backend}: outputs {tuple(out.shape)}, last states {tuple(last.shape)}, "
        f"forward + backward {1e3 * (time.perf_counter() - started):.1f} ms (first call, includes any build)"
    )
    grads = {n: float(p.grad.norm()) for n, p in layer.named_parameters()}
    print("gradient norms:", ", ".join(f"{n} {g:.3g}" for n, g in grads.items()))

    if cell.name == "lstm":
        ref = torch.nn.LSTM(I, H, batch_first=True).to(device, dtype)
        with torch.no_grad():
            ref.weight_ih_l0.copy_(layer.input_proj.weight)
            ref.bias_ih_l0.copy_(layer.input_proj.bias)
            ref.weight_hh_l0.copy_(layer.R.reshape(4 * H, H))
            ref.bias_hh_l0.copy_(layer.b.reshape(4 * H))
            expected, _ = ref(x)
            err = float((out - expected).norm() / expected.norm())
        print(f"relative difference to torch.nn.LSTM: {err:.2e}")
        if err > 1e-4:
            print("MISMATCH", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(main(sys.argv[1]))
