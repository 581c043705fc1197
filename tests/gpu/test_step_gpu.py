"""Step mode on the fused backend (``pytest -m gpu``): ``T`` steps against the float64
reference sequence, outputs, states and gradients within the dtype's tolerance, the plan a
fused one; and ``N`` decoding steps (each input computed from the last output) captured in a
CUDA graph and replayed equal the same steps run eagerly."""

from __future__ import annotations

import pytest
import torch
from gpu_reference import DTYPES, INPUTS, ROOT

import rnncc
from rnncc.testing import TOLERANCES, random_inputs, rel_err

pytestmark = pytest.mark.gpu

CASES = [("lstm", "bf16", 16, 12, 64), ("gru", "fp32", 4, 1, 64), ("slstm", "bf16", 8, 1, 256)]


@pytest.mark.parametrize(("name", "dtype", "B", "NH", "D"), CASES, ids=lambda c: str(c))
def test_fused_steps_equal_the_reference_sequence(name, dtype, B, NH, D) -> None:
    cell = rnncc.load(ROOT / "examples" / f"{name}.rnn")
    T, dt = 6, DTYPES[dtype]
    x64 = random_inputs(cell.ir, B, T, NH, D, seed=3)
    x = {k: None if v is None else v.to("cuda", dt).requires_grad_() for k, v in x64.items()}
    ref = {k: None if v is None else v.detach().double().requires_grad_() for k, v in x.items()}
    states, ys = x["states"], []
    for t in range(T):
        y_t, states = cell.step(x["Wx"][:, t], x["R"], x["b"], states, x["params"], "fused")
        ys.append(y_t)
        assert cell.last_backend == "fused" and cell.last_plan.fused
    y = torch.stack(ys, dim=2)
    y_ref, last_ref = cell(*(ref[k] for k in INPUTS), backend="reference")
    tol = TOLERANCES[dt]
    assert rel_err(y, y_ref) <= tol and rel_err(states, last_ref) <= tol
    g = torch.randn(y_ref.shape, device="cuda", dtype=torch.float64)
    names = [k for k in INPUTS if x[k] is not None]
    grads = torch.autograd.grad(
        (y.double() * g).sum() + states.double().sum(), [x[k] for k in names]
    )
    grads_ref = torch.autograd.grad((y_ref * g).sum() + last_ref.sum(), [ref[k] for k in names])
    for k, a, b in zip(names, grads, grads_ref, strict=True):
        assert rel_err(a, b) <= tol, (k, rel_err(a, b))


def test_decoding_steps_capture_in_a_cuda_graph() -> None:
    """x_{t+1} = W_out y_t: each step's input depends on the last output (no hoisting)."""
    cell = rnncc.load(ROOT / "examples" / "lstm.rnn")
    B, NH, D, N = 4, 1, 64, 5
    x = random_inputs(cell.ir, B, 1, NH, D, seed=4, dtype=torch.float32, device="cuda")
    R, b = x["R"].bfloat16(), x["b"].bfloat16()
    w_in = torch.randn(NH * D, 4 * NH * D, device="cuda").bfloat16() * 0.1
    start = x["Wx"][:, 0].bfloat16()
    s0 = x["states"].bfloat16()

    def decode(wx: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        for _ in range(N):
            y, s = cell.step(wx, R, b, s, backend="fused")
            wx = (y[0].reshape(B, NH * D) @ w_in).view(B, 4, NH, D)
        return wx, s

    with torch.no_grad():
        eager = decode(start, s0)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            decode(start, s0)  # warm-up on the capturing stream
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        wx_in, s_in = start.clone(), s0.clone()
        with torch.cuda.graph(graph):
            captured = decode(wx_in, s_in)
        graph.replay()
        torch.cuda.synchronize()
    for a, e in zip(captured, eager, strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=0)
