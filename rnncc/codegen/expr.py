"""IR expressions → CUDA C++ device code, in float32.

Input: a list of named roots, the names of the leaves (a function of the leaf node) and the
identifiers already taken. Output: ``CudaBody`` — the ``const float name = expr;`` lines of
the shared subexpressions in evaluation order, and one C expression per root.

Rendering: precedence-aware parentheses (C's precedence for ``+ - * /``, unary minus and
comparisons matches the language's), float literals with an ``f`` suffix (no silent double
math), ``INFINITY`` for inf, the op table's CUDA spelling for every function (device helpers
in ``templates/rnncc_ops.cuh``), ``pow`` with a small integer exponent as a product, and
user-derived identifiers with a prefix (``v_logf``) so they can never collide with C++
keywords or the kernel's own variables. The same IR always renders to the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from rnncc.ir.node import Node
from rnncc.ir.ops import OPS, PREC_ATOM, PREC_MUL, PREC_NEG
from rnncc.ir.schedule import NameAllocator, schedule


def cuda_float(value: float) -> str:
    """A float32 C literal for ``value``."""
    if math.isinf(value):
        return "INFINITY" if value > 0 else "(-INFINITY)"
    if math.isnan(value):
        return "NAN"
    text = repr(float(value))
    if "e" not in text and "." not in text:
        text += ".0"
    return f"{text}f"


def _pow_text(base: str, exponent: float) -> tuple[str, int]:
    """``base ** exponent`` in C; small integer exponents become products (exact like torch)."""
    if exponent == 0.0:
        return "1.0f", PREC_ATOM
    if exponent == 1.0:
        return base, PREC_ATOM
    if exponent == 0.5:
        return f"sqrtf({base})", PREC_ATOM
    if exponent.is_integer() and 2 <= exponent <= 4:
        return " * ".join([base] * int(exponent)), PREC_MUL
    if exponent == -1.0:
        return f"(1.0f / {base})", PREC_ATOM
    return f"powf({base}, {cuda_float(exponent)})", PREC_ATOM


@dataclass(frozen=True)
class CudaBody:
    """Straight-line CUDA for a set of roots: temporaries, then one expression per root."""

    lines: tuple[str, ...]  # "const float v_t0 = ...;" in evaluation order
    results: tuple[str, ...]  # one C expression per root, in order


class CudaRenderer:
    """Renders IR nodes to C expressions; ``leaf(node)`` names the leaves."""

    def __init__(self, leaf: Callable[[Node], str], names: dict[Node, str]):
        self.leaf = leaf
        self.names = names

    def prec(self, node: Node) -> int:
        if node in self.names or (node.is_leaf and node.op != "const"):
            return PREC_ATOM
        if node.op == "const":
            return PREC_NEG if node.arg < 0 else PREC_ATOM
        if node.op == "pow":
            return PREC_MUL if node.arg in (2.0, 3.0, 4.0) else PREC_ATOM
        row = OPS[node.op]
        return PREC_ATOM if row.kind == "call" else row.prec

    def expr(self, node: Node, *, top: bool = False) -> str:
        if not top and node in self.names:
            return self.names[node]
        if node.op == "const":
            return cuda_float(node.arg)
        if node.is_leaf:
            return self.leaf(node)
        row = OPS[node.op]
        if node.op == "pow":
            base = self.sub(node.src[0], PREC_ATOM)
            return _pow_text(base, float(node.arg))[0]
        if row.kind == "call":
            args = [self.expr(s) for s in node.src]
            return row.cuda.format(*args)
        if row.kind == "prefix":
            return f"-{self.sub(node.src[0], PREC_NEG + 1)}"
        left, right = node.src
        return f"{self.sub(left, row.prec)} {row.cuda} {self.sub(right, row.prec + 1)}"

    def sub(self, node: Node, min_prec: int) -> str:
        text = self.expr(node)
        return f"({text})" if self.prec(node) < min_prec else text


def render_body(
    roots: list[Node] | tuple[Node, ...],
    leaf: Callable[[Node], str],
    *,
    prefix: str = "v_",
) -> CudaBody:
    """Schedule ``roots`` and render them; see the module docstring. Temporaries are named
    ``prefix`` + the user's name (or ``t<n>``); leaves must use other prefixes."""
    sched = schedule(roots, NameAllocator())
    names = {node: prefix + name for node, name in sched.names.items()}
    r = CudaRenderer(leaf, names)
    lines = tuple(
        f"const float {names[node]} = {r.expr(node, top=True)};" for _, node in sched.bindings
    )
    results = tuple(r.expr(root) for root in roots)
    return CudaBody(lines, results)
