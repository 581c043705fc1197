"""Every op's derivative rule against torch autograd, edge cases included, and gradcheck of
every op through the reference backend over a short sequence."""

from __future__ import annotations

import pytest
import torch

import rnncc
from rnncc.frontend import compile_source
from rnncc.ir.ops import FUNCTIONS, OPS
from rnncc.testing import backward_vs_autograd, random_inputs, step_leaves

# One expression per op over gates a, c and state h; the leaf tweaks put values on the edge
# cases PyTorch defines specially (kinks, ties, the softplus threshold).
CASES: dict[str, tuple[str, str]] = {
    "add": ("a + c", ""),
    "sub": ("a - c", ""),
    "mul": ("a * c", ""),
    "div": ("a / c", "c_positive"),
    "neg": ("-a", ""),
    "pow": ("a ** 3 + a ** 2 + a ** 0 + c ** 0.5 + c ** -1.5", "c_positive"),
    "sigmoid": ("sigmoid(a)", ""),
    "tanh": ("tanh(a)", ""),
    "exp": ("exp(a)", ""),
    "log": ("log(c)", "c_positive"),
    "logsigmoid": ("logsigmoid(a * 30)", ""),
    "softplus": ("softplus(a)", "a_large"),
    "relu": ("relu(a)", "a_zeros"),
    "abs": ("abs(a)", "a_zeros"),
    "sqrt": ("sqrt(c)", "c_positive"),
    "max": ("max(a, c)", "ties"),
    "min": ("min(a, c)", "ties"),
    "where": ("where(a > c, a * h, c)", "ties"),
    "detach": ("detach(a) * c + a", ""),
    "lt": ("where(a < c, a, c * h)", "ties"),
    "le": ("where(a <= c, a, c * h)", "ties"),
    "gt": ("where(a > c, a, c * h)", "ties"),
    "ge": ("where(a >= c, a, c * h)", "ties"),
    "eq": ("where(a == c, a, c * h)", "ties"),
    "ne": ("where(a != c, a, c * h)", "ties"),
}

# Smooth versions for finite differences (no kinks or ties on random data, domains kept).
GRADCHECK: dict[str, str] = {
    "div": "a / (c * c + 1)",
    "pow": "(a * a + 1) ** -1.5 + a ** 3",
    "log": "log(c * c + 1)",
    "sqrt": "sqrt(c * c + 1)",
    "logsigmoid": "logsigmoid(a)",
    "detach": "a * c",
}


def _cell(expr: str):
    text = f"cell op_test(h) {{\n    gates a, c = W x + R h + b\n    h = {expr} + 0 * h\n}}\n"
    cells, _ = compile_source(text)
    return cells[0]


def _leaves(cell, tweak: str):
    leaves = step_leaves(cell, (4, 6), seed=3)
    a, c = leaves[("gate", "a")], leaves[("gate", "c")]
    if tweak == "c_positive":
        leaves[("gate", "c")] = c.abs() + 0.5
    elif tweak == "a_large":
        a[::2] = 18.0 + 5 * a[::2].abs()  # on both sides of softplus's threshold of 20
    elif tweak == "a_zeros":
        a[::2] = 0.0
    elif tweak == "ties":
        c[::2] = a[::2]
    return leaves


def test_every_op_has_a_case():
    differentiable = {name for name, row in OPS.items() if row.kind != "leaf"}
    assert differentiable == set(CASES)


@pytest.mark.parametrize("op", sorted(CASES))
def test_derivative_matches_autograd(op):
    expr, tweak = CASES[op]
    cell = _cell(expr)
    assert backward_vs_autograd(cell, _leaves(cell, tweak)) <= 1e-12


@pytest.mark.parametrize(
    "op", sorted(set(FUNCTIONS.values()), key=lambda r: r.name), ids=lambda r: r.name
)
def test_function_gradcheck(op):
    expr = GRADCHECK.get(op.name, CASES[op.name][0])
    compiled = rnncc.loads(
        f"cell op_test(h) {{\n    gates a, c = W x + R h + b\n    h = {expr} + h + 0 * (a + c)\n}}\n"
    )
    x = random_inputs(compiled.ir, 2, 3, 1, 3, seed=5)
    args = tuple(x[k].requires_grad_() for k in ("Wx", "R", "b", "states"))
    assert torch.autograd.gradcheck(lambda *a: compiled(*a, backend="reference"), args)


def test_softplus_threshold_matches_torch():
    cell = _cell("softplus(a)")
    leaves = _leaves(cell, "a_large")
    from rnncc.ir.interpret import evaluate

    (out,) = evaluate([cell.update("h")], leaves, dtype=torch.float64)
    expected = torch.nn.functional.softplus(leaves[("gate", "a")])
    assert torch.equal(out, expected)


def test_max_tie_splits_gradient_in_half():
    from rnncc.autodiff import derive_backward
    from rnncc.ir.interpret import evaluate

    cell = _cell("max(a, c)")
    bwd = derive_backward(cell)
    one = torch.ones(1, dtype=torch.float64)
    leaves = {("state", "h"): one, ("gate", "a"): one, ("gate", "c"): one.clone()}
    leaves[("dstate", "h")] = one
    leaves[("dout", "h")] = 0 * one
    got = dict(
        zip(
            [n for n, _ in bwd.d_gates],
            evaluate([n for _, n in bwd.d_gates], leaves, dtype=torch.float64),
        )
    )
    assert float(got["a"]) == 0.5 and float(got["c"]) == 0.5
