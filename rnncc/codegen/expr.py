"""IR expressions → CUDA C++ device code, in float32.

Input: a list of named roots, the names of the leaves (a function of the leaf node) and the
identifiers already taken. Output: ``CudaBody`` — the ``const float name = expr;`` lines of
the shared subexpressions in evaluation order, and one C expression per root.

Rendering: precedence-aware parentheses (C's precedence for ``+ - * /``, unary minus and
comparisons matches the language's), float literals with an ``f`` suffix (no silent double
math), ``INFINITY`` for inf, temporaries for subexpressions nested deeper than
``MAX_DEPTH``, the op table's CUDA spelling for every function (device helpers
in ``templates/rnncc_ops.cuh``), ``pow`` with a small integer exponent as a product, and
user-derived identifiers with a prefix (``v_logf``) so they can never collide with C++
keywords or the kernel's own variables. The same IR always renders to the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from string import Formatter

from rnncc.ir.node import Node
from rnncc.ir.ops import OPS, PREC_ATOM, PREC_MUL, PREC_NEG
from rnncc.ir.printer import write_out
from rnncc.ir.schedule import NameAllocator, schedule
from rnncc.ir.simplify import to_float32

#: Operators one rendered C expression may nest; deeper ones are split into temporaries, so
#: that a sum of thousands of terms does not become one expression that nvcc parses slowly.
MAX_DEPTH = 64


def cuda_float(value: float) -> str:
    """A float32 C literal for ``value``. A value float32 cannot hold (the front end neither
    accepts nor folds into one, but IR built otherwise may) is written as what float32 makes
    of it, inf or 0: C++ does not allow a float literal out of float's range."""
    if math.isnan(value):
        return "NAN"
    single = to_float32(value)
    if math.isinf(single):
        return "INFINITY" if value > 0 else "(-INFINITY)"
    if single == 0.0:
        value = single
    text = repr(float(value))
    if "e" not in text and "." not in text:
        text += ".0"
    return f"{text}f"


def _pow_pieces(exponent: float) -> tuple[list[str | None], int]:
    """``base ** exponent`` in C as literal pieces, ``None`` where the base goes, and its
    precedence; small integer exponents become products (exact like torch)."""
    if exponent == 0.0:
        return ["1.0f"], PREC_ATOM
    if exponent == 1.0:
        return [None], PREC_ATOM
    if exponent == 0.5:
        return ["sqrtf(", None, ")"], PREC_ATOM
    if exponent.is_integer() and 2 <= exponent <= 4:
        return [None, *[" * ", None] * (int(exponent) - 1)], PREC_MUL
    if exponent == -1.0:
        return ["(1.0f / ", None, ")"], PREC_ATOM
    return ["powf(", None, f", {cuda_float(exponent)})"], PREC_ATOM


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
        """``node`` as a C expression, written out piece by piece from an explicit stack: a
        sum of thousands of terms is a tree thousands of levels deep."""
        return write_out(self._pieces(node) if top else [node], self.names, self._pieces)

    def _pieces(self, node: Node) -> list[Node | str]:
        """``node``'s C as literal pieces and operands still to be written."""
        if node.op == "const":
            return [cuda_float(node.arg)]
        if node.is_leaf:
            return [self.leaf(node)]
        row = OPS[node.op]
        if node.op == "pow":
            base = self.sub(node.src[0], PREC_ATOM)
            pieces, _ = _pow_pieces(float(node.arg))
            return [q for p in pieces for q in (base if p is None else [p])]
        if row.kind == "call":
            parts: list[Node | str] = []
            for literal, field, _, _ in Formatter().parse(row.cuda):
                parts.append(literal)
                if field is not None:
                    parts.append(node.src[int(field)])
            return parts
        if row.kind == "prefix":
            return ["-", *self.sub(node.src[0], PREC_NEG + 1)]
        left, right = node.src
        return [*self.sub(left, row.prec), f" {row.cuda} ", *self.sub(right, row.prec + 1)]

    def sub(self, node: Node, min_prec: int) -> list[Node | str]:
        """``node`` as an operand that binds at least as tightly as ``min_prec``."""
        return ["(", node, ")"] if self.prec(node) < min_prec else [node]


def render_body(
    roots: list[Node] | tuple[Node, ...],
    leaf: Callable[[Node], str],
    *,
    prefix: str = "v_",
    root_names: list[str | None] | None = None,
) -> CudaBody:
    """Schedule ``roots`` and render them; see the module docstring. Temporaries are named
    ``prefix`` + the user's name (or ``t<n>``); leaves must use other prefixes. A root that
    other expressions also use is bound under its name from ``root_names`` (``new_c``) where
    one is given, so that the code reads as the cell does; its result is then that name."""
    given: dict[Node, str] = {}
    for root, name in zip(roots, root_names or [], strict=False):
        if name is not None and not root.is_leaf:
            given.setdefault(root, name)
    sched = schedule(roots, NameAllocator(), max_depth=MAX_DEPTH, root_names=given)
    names = {
        node: name if given.get(node) == name else prefix + name
        for node, name in sched.names.items()
    }
    r = CudaRenderer(leaf, names)
    lines = tuple(
        f"const float {names[node]} = {r.expr(node, top=True)};" for _, node in sched.bindings
    )
    results = tuple(r.expr(root) for root in roots)
    return CudaBody(lines, results)
