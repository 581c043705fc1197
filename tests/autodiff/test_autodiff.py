"""The derived backward cell equals torch autograd through the forward interpreter
(float64, ≤ 1e-12 relative) for every example, edge branches and random cells."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from strategies import cell_sources

from rnncc.autodiff import derive_backward
from rnncc.frontend import compile_file, compile_source
from rnncc.ir.node import toposort
from rnncc.ir.printer import print_backward
from rnncc.ir.verify import verify_backward, verify_cell
from rnncc.testing import backward_vs_autograd, step_leaves

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.rnn"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_examples(path):
    (cell,), _ = compile_file(path)
    verify_cell(cell)
    verify_backward(derive_backward(cell))
    for seed in range(3):
        assert backward_vs_autograd(cell, step_leaves(cell, (3, 5), seed=seed)) <= 1e-12


def test_slstm_first_step_branch():
    """n == 0 selects m = i: finite differences cannot probe that branch, autograd can."""
    (cell,), _ = compile_file(next(p for p in EXAMPLES if p.stem == "slstm"))
    leaves = step_leaves(cell, (4, 6), seed=2)
    leaves[("state", "n")][::2] = 0.0
    assert backward_vs_autograd(cell, leaves) <= 1e-12


def test_detach_passes_no_gradient():
    (cell,), _ = compile_source("cell d(h) {\n  gates a = W x + R h\n  h = detach(a) * h + a\n}\n")
    bwd = derive_backward(cell)
    assert "detach" not in print_backward(bwd).split("da =")[1].splitlines()[0]
    assert backward_vs_autograd(cell, step_leaves(cell, (3, 4))) <= 1e-12


def test_unused_state_gets_zero_cotangent():
    (cell,), _ = compile_source(
        "cell z(h, c) {\n  gates a = W x + R h\n  c = a\n  h = tanh(c)\n}\n"
    )
    bwd = derive_backward(cell)
    assert dict(bwd.d_states)["c"].op == "const" and dict(bwd.d_states)["c"].arg == 0.0


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_the_backward_reuses_the_forward_nodes(path):
    """Where the backward recomputes a forward value it holds the forward's own node, not an
    equal copy: copies are compared node by node wherever the two DAGs meet (the package's
    node table), which a chain of thousands made seconds long."""
    (cell,), _ = compile_file(path)
    forward = {n: n for n in toposort([n for _, n in cell.updates])}
    bwd = derive_backward(cell)
    copies = [n for n in toposort(bwd.roots) if forward.get(n, n) is not n]
    assert not copies


def test_backward_is_deterministic():
    (cell,), _ = compile_file(next(p for p in EXAMPLES if p.stem == "slstm"))
    assert print_backward(derive_backward(cell)) == print_backward(derive_backward(cell))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cell_sources())
def test_random_cells(text):
    (cell,), _ = compile_source(text)
    verify_cell(cell)
    verify_backward(derive_backward(cell))
    assert backward_vs_autograd(cell, step_leaves(cell, (3, 4), seed=1)) <= 1e-12


def test_ties_in_random_data_do_not_break_max():
    (cell,), _ = compile_source(
        "cell t(h) {\n  gates a, c = W x\n  h = max(a, c) * min(c, a) + h\n}\n"
    )
    leaves = step_leaves(cell, (2, 8))
    leaves[("gate", "c")][:, ::2] = leaves[("gate", "a")][:, ::2]
    assert backward_vs_autograd(cell, leaves) <= 1e-12
    assert torch.isfinite(leaves[("gate", "c")]).all()


def test_division_gradient_as_torch_where_the_divisor_squared_leaves_float32():
    """a / z's gradient in z was -g * a / (z * z): 0 where z * z overflows float32 (z = 2e19)
    and off by the subnormal rounding where it underflows (z = 1e-20); PyTorch's is
    -g * ((a / z) / z)."""
    import rnncc

    cell = rnncc.loads("cell c(h) { gates a, z = W x; h = a / z }")
    Wx = torch.tensor([3e19, 2e19, 1e-20, 1e-20]).view(2, 1, 2, 1, 1).requires_grad_()
    y, _ = cell(Wx, backend="reference")
    y.sum().backward()
    a, z = Wx.detach()[:, 0, 0], Wx.detach()[:, 0, 1]
    a.requires_grad_(), z.requires_grad_()
    (a / z).sum().backward()
    torch.testing.assert_close(Wx.grad[:, 0, 1], z.grad, rtol=0, atol=0)
    assert (Wx.grad[:, 0, 1] != 0).all()
