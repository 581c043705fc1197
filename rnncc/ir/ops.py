"""The op table: every operation of the cell language in one row each.

A row holds the op's name, arity, how it is written in the surface language (infix symbol,
prefix, or function name) with its precedence, its CUDA spelling, its torch reference and its
derivative rule. Adding a function to the language is one new row here (and, for a new CUDA
helper, one device function in ``templates/rnncc_ops.cuh``).

Derivative rules follow PyTorch's formulas for the same function, edge cases included: ties
of ``max``/``min`` split the cotangent in half, ``relu'(0) = abs'(0) = 0``, ``detach`` and the
comparisons pass none, ``softplus`` switches to the identity above 20 like
``torch.nn.functional.softplus``. A rule maps ``(node, cotangent)`` to one cotangent per
operand (``None`` where none flows) and builds plain nodes; the autodiff pass folds and CSEs.

Leaves: ``const`` (arg: the value), ``state`` (arg: state name, the previous step's value),
``gate`` (arg: gate name, the sum of its parts ``W x``, ``R h``, ``b``), ``param`` (arg: name);
in backward cells also ``dstate`` (cotangent of a new state arriving from later steps) and
``dout`` (cotangent of a per-step output).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from rnncc.ir.node import Node

GradRule = Callable[[Node, Node], tuple[Node | None, ...]]

# Surface precedence, loosest first. Unary minus binds looser than ** (-x**2 == -(x**2)).
PREC_COMPARE = 1
PREC_ADD = 2
PREC_MUL = 3
PREC_NEG = 4
PREC_POW = 5
PREC_ATOM = 9


@dataclass(frozen=True)
class OpDef:
    """One row of the op table.

    ``kind``: ``leaf`` | ``infix`` | ``prefix`` | ``call`` | ``compare``.
    ``symbol``: the infix/prefix symbol or the function's name in the language.
    ``cuda``: a format string over the rendered operands ``{0} {1} {2}`` and ``{arg}``;
    for infix ops the bare operator.
    ``ref``: the torch reference, called with tensors (and ``arg`` for ``pow``).
    ``mufu``, ``alu``: special-function unit (MUFU) and plain fp32 instructions per evaluation,
    as the fast-math CUDA spelling compiles (the variants' cost models read them): sigmoid =
    1/(1 + ex2(-x·log2e)) is ex2 + rcp; tanh is MUFU.TANH (sm_75+); logsigmoid and softplus
    (stable forms) are ex2 + lg2; div is rcp plus a Newton step; pow is ex2(y·lg2(x)) (small
    integer exponents are cheaper: this bounds them); leaves and detach cost nothing.
    """

    name: str
    arity: int
    kind: str
    symbol: str | None
    prec: int
    cuda: str
    ref: Callable[..., Any] | None
    grad: GradRule | None
    mufu: int = 0
    alu: int = 1


def N(op: str, *src: Node, arg: Any = None) -> Node:
    """A raw node, no folding: derivative rules use it and leave simplifying to the passes."""
    return Node(op, tuple(src), arg)


def _c(v: float) -> Node:
    return Node("const", (), float(v))


def _zero_where(cond: Node, g: Node) -> Node:
    return N("where", cond, g, _c(0.0))


def _grad_max(node: Node, g: Node) -> tuple[Node | None, ...]:
    a, b = node.src
    half = N("mul", g, _c(0.5))
    da = N("where", N("gt", a, b), g, N("where", N("eq", a, b), half, _c(0.0)))
    db = N("where", N("gt", b, a), g, N("where", N("eq", a, b), half, _c(0.0)))
    return da, db


def _grad_min(node: Node, g: Node) -> tuple[Node | None, ...]:
    a, b = node.src
    half = N("mul", g, _c(0.5))
    da = N("where", N("lt", a, b), g, N("where", N("eq", a, b), half, _c(0.0)))
    db = N("where", N("lt", b, a), g, N("where", N("eq", a, b), half, _c(0.0)))
    return da, db


def _grad_pow(node: Node, g: Node) -> tuple[Node | None, ...]:
    (x,) = node.src
    c = float(node.arg)
    if c == 0.0:  # torch: pow_backward returns zeros for a zero exponent
        return (None,)
    return (N("mul", g, N("mul", _c(c), N("pow", x, arg=c - 1.0))),)


def _grad_abs(node: Node, g: Node) -> tuple[Node | None, ...]:
    (x,) = node.src  # torch: grad * sgn(x), sgn(0) = 0
    return (
        N("where", N("gt", x, _c(0.0)), g, N("where", N("lt", x, _c(0.0)), N("neg", g), _c(0.0))),
    )


def _softplus(x: torch.Tensor) -> torch.Tensor:
    return F.softplus(x)


def _pow(x: torch.Tensor, c: float) -> torch.Tensor:
    return torch.pow(x, c)


def _compare(name: str, symbol: str, fn: Callable[..., Any], cuda: str) -> OpDef:
    return OpDef(
        name, 2, "compare", symbol, PREC_COMPARE, cuda, fn, lambda n, g: (None, None), 0, 1
    )


def _leaf(name: str) -> OpDef:
    return OpDef(name, 0, "leaf", None, PREC_ATOM, "", None, None, 0, 0)


_ROWS: tuple[OpDef, ...] = (
    # leaves
    _leaf("const"),
    _leaf("state"),
    _leaf("gate"),
    _leaf("param"),
    _leaf("dstate"),
    _leaf("dout"),
    # arithmetic
    OpDef("add", 2, "infix", "+", PREC_ADD, "+", torch.add, lambda n, g: (g, g)),
    OpDef("sub", 2, "infix", "-", PREC_ADD, "-", torch.sub, lambda n, g: (g, N("neg", g))),
    OpDef(
        "mul",
        2,
        "infix",
        "*",
        PREC_MUL,
        "*",
        torch.mul,
        lambda n, g: (N("mul", g, n.src[1]), N("mul", g, n.src[0])),
    ),
    OpDef(
        "div",
        2,
        "infix",
        "/",
        PREC_MUL,
        "/",
        torch.div,
        # torch: self: grad / other; other: -grad * ((self / other) / other), the quotient
        # n itself (other * other would overflow or underflow where the quotient does not)
        lambda n, g: (
            N("div", g, n.src[1]),
            N("mul", N("neg", g), N("div", n, n.src[1])),
        ),
        mufu=1,
        alu=3,
    ),
    OpDef("neg", 1, "prefix", "-", PREC_NEG, "-", torch.neg, lambda n, g: (N("neg", g),)),
    OpDef("pow", 1, "infix", "**", PREC_POW, "rnncc_pow({0}, {arg})", _pow, _grad_pow, 2, 2),
    # functions
    OpDef(
        "sigmoid",
        1,
        "call",
        "sigmoid",
        PREC_ATOM,
        "rnncc_sigmoid({0})",
        torch.sigmoid,
        # torch: sigmoid_backward = grad * (1 - y) * y
        lambda n, g: (N("mul", N("mul", g, N("sub", _c(1.0), n)), n),),
        mufu=2,
        alu=2,
    ),
    OpDef(
        "tanh",
        1,
        "call",
        "tanh",
        PREC_ATOM,
        "rnncc_tanh({0})",
        torch.tanh,
        # torch: tanh_backward = grad * (1 - y * y)
        lambda n, g: (N("mul", g, N("sub", _c(1.0), N("mul", n, n))),),
        mufu=1,
        alu=0,
    ),
    OpDef(
        "exp",
        1,
        "call",
        "exp",
        PREC_ATOM,
        "rnncc_exp({0})",
        torch.exp,
        lambda n, g: (N("mul", g, n),),
        mufu=1,
        alu=1,
    ),
    OpDef(
        "log",
        1,
        "call",
        "log",
        PREC_ATOM,
        "rnncc_log({0})",
        torch.log,
        lambda n, g: (N("div", g, n.src[0]),),
        mufu=1,
        alu=1,
    ),
    OpDef(
        "logsigmoid",
        1,
        "call",
        "logsigmoid",
        PREC_ATOM,
        "rnncc_logsigmoid({0})",
        F.logsigmoid,
        lambda n, g: (N("mul", g, N("sigmoid", N("neg", n.src[0]))),),
        mufu=2,
        alu=4,
    ),
    OpDef(
        "softplus",
        1,
        "call",
        "softplus",
        PREC_ATOM,
        "rnncc_softplus({0})",
        _softplus,
        # torch: x > 20 ? grad : grad * z / (z + 1), z = exp(x)
        lambda n, g: (
            N("where", N("gt", n.src[0], _c(20.0)), g, N("mul", g, N("sigmoid", n.src[0]))),
        ),
        mufu=2,
        alu=4,
    ),
    OpDef(
        "relu",
        1,
        "call",
        "relu",
        PREC_ATOM,
        "rnncc_relu({0})",
        torch.relu,
        # torch: threshold_backward(grad, result, 0): grad where result > 0
        lambda n, g: (_zero_where(N("gt", n, _c(0.0)), g),),
    ),
    OpDef("abs", 1, "call", "abs", PREC_ATOM, "fabsf({0})", torch.abs, _grad_abs),
    OpDef(
        "sqrt",
        1,
        "call",
        "sqrt",
        PREC_ATOM,
        "rnncc_sqrt({0})",
        torch.sqrt,
        # torch: grad / (2 * result)
        lambda n, g: (N("div", g, N("mul", _c(2.0), n)),),
        mufu=1,
        alu=1,
    ),
    OpDef("max", 2, "call", "max", PREC_ATOM, "rnncc_max({0}, {1})", torch.maximum, _grad_max),
    OpDef("min", 2, "call", "min", PREC_ATOM, "rnncc_min({0}, {1})", torch.minimum, _grad_min),
    OpDef(
        "where",
        3,
        "call",
        "where",
        PREC_ATOM,
        "({0} ? {1} : {2})",
        torch.where,
        lambda n, g: (
            None,
            N("where", n.src[0], g, _c(0.0)),
            N("where", n.src[0], _c(0.0), g),
        ),
    ),
    OpDef(
        "detach",
        1,
        "call",
        "detach",
        PREC_ATOM,
        "{0}",
        torch.Tensor.detach,
        lambda n, g: (None,),
        alu=0,
    ),
    # comparisons: only as the first argument of where
    _compare("lt", "<", torch.lt, "<"),
    _compare("le", "<=", torch.le, "<="),
    _compare("gt", ">", torch.gt, ">"),
    _compare("ge", ">=", torch.ge, ">="),
    _compare("eq", "==", torch.eq, "=="),
    _compare("ne", "!=", torch.ne, "!="),
)

OPS: dict[str, OpDef] = {row.name: row for row in _ROWS}

#: The functions a cell may call, by surface name.
FUNCTIONS: dict[str, OpDef] = {
    row.symbol: row for row in _ROWS if row.kind == "call" and row.symbol
}
#: Infix binary operators by symbol (``**`` is handled by the frontend: constant exponent).
BINARY: dict[str, OpDef] = {
    row.symbol: row for row in _ROWS if row.kind == "infix" and row.name != "pow" and row.symbol
}
COMPARISONS: dict[str, OpDef] = {
    row.symbol: row for row in _ROWS if row.kind == "compare" and row.symbol
}
LEAVES = frozenset(row.name for row in _ROWS if row.kind == "leaf")


def op(name: str) -> OpDef:
    """The row of ``name``; a missing row is an internal error, never a user error."""
    try:
        return OPS[name]
    except KeyError:
        from rnncc.errors import InternalError

        raise InternalError(f"unknown IR op {name!r}") from None
