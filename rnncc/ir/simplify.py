"""Canonicalisation passes over expression DAGs: constant folding, exact identities, CSE.

Input: root nodes. Output: equivalent roots in which equal subexpressions are one object
(common-subexpression elimination), operations on constants are evaluated with the op's own
torch reference in float64 (so folding agrees with the reference backend), and identities
that hold exactly in IEEE arithmetic are applied (``x + 0``, ``x * 1``, ``x / 1``,
``--x``, ``x ** 1``, ``where(c, x, x)``). ``0 * x`` is not folded: it is not 0 for
``x = inf`` or NaN. A constant is folded only into a number float32 holds as itself (not
NaN, nor a finite value that float32 makes inf or 0, such as ``1e30 * 1e30``): folded
constants must print as numbers a cell may contain. Name hints survive: a merged node keeps
the name of its first occurrence.
"""

from __future__ import annotations

import math
import struct

import torch

from rnncc.ir.node import Node, toposort
from rnncc.ir.ops import OPS


def to_float32(value: float) -> float:
    """``value`` as the kernels hold it, rounded to float32: ±inf past float32's range, ±0
    below its smallest subnormal."""
    try:
        return float(struct.unpack("f", struct.pack("f", value))[0])
    except OverflowError:  # finite in float64, too large for float32
        return math.copysign(math.inf, value)


def float32_holds(value: float) -> bool:
    """Whether float32 keeps ``value`` what it is: not finite turned inf, nor nonzero turned 0
    (inf, 0 and NaN stay themselves). Only such numbers may be written in a cell."""
    single = to_float32(value)
    return not (math.isinf(single) and math.isfinite(value)) and not (single == 0 != value)


def _is_const(node: Node, value: float | None = None) -> bool:
    return node.op == "const" and (value is None or node.arg == value)


def _is_signed_zero(node: Node, *, negative: bool) -> bool:
    return _is_const(node, 0.0) and (math.copysign(1.0, node.arg) < 0) == negative


def _fold_value(node: Node) -> float | None:
    """The value of an op over constant operands, or None when it does not fold."""
    row = OPS[node.op]
    if row.kind in ("leaf", "compare") or row.ref is None or node.op == "where":
        return None
    if not all(_is_const(s) for s in node.src):
        return None
    args = [torch.tensor(s.arg, dtype=torch.float64) for s in node.src]
    out = row.ref(*args, node.arg) if node.op == "pow" else row.ref(*args)
    value = float(out)
    # A constant is folded only into a number the language can write, so that the printed
    # IR reads back; the kernels then compute the rest in float32 (giving inf or 0 there).
    return value if float32_holds(value) and not math.isnan(value) else None


def _compare_value(node: Node) -> bool | None:
    if OPS[node.op].kind != "compare" or not all(_is_const(s) for s in node.src):
        return None
    a, b = (torch.tensor(s.arg, dtype=torch.float64) for s in node.src)
    return bool(OPS[node.op].ref(a, b))  # type: ignore[misc]


def simplify_node(node: Node) -> Node:
    """One local rewrite step on a node whose operands are already simplified."""
    folded = _fold_value(node)
    if folded is not None:
        return Node("const", (), folded, name=node.name, span=node.span)
    op, src = node.op, node.src
    # x + (-0) and x - (+0) are x for every x; x + (+0) is not where x is -0 (it is +0)
    if op == "add":
        if _is_signed_zero(src[1], negative=True):
            return src[0]
        if _is_signed_zero(src[0], negative=True):
            return src[1]
    elif op == "sub":
        if _is_signed_zero(src[1], negative=False):
            return src[0]
    elif op == "mul":
        if _is_const(src[1], 1.0):
            return src[0]
        if _is_const(src[0], 1.0):
            return src[1]
    elif op == "div":
        if _is_const(src[1], 1.0):
            return src[0]
    elif op == "neg":
        if src[0].op == "neg":
            return src[0].src[0]
    elif op == "pow":
        if node.arg == 1.0:
            return src[0]
    elif op == "detach":
        if src[0].op in ("detach", "const"):
            return src[0]
    elif op == "where":
        picked = _compare_value(src[0])
        if picked is not None:
            return src[1] if picked else src[2]
        if src[1] == src[2]:
            return src[1]
    return node


def canonicalize(roots: list[Node] | tuple[Node, ...]) -> list[Node]:
    """Fold, simplify and CSE the DAG below ``roots``; returns the new roots in order."""
    interned: dict[Node, Node] = {}
    memo: dict[Node, Node] = {}
    for node in toposort(list(roots)):
        src = tuple(memo[s] for s in node.src)
        # Identity, not equality: comparing equal deep operands would walk them again.
        rebuilt = (
            node
            if all(a is b for a, b in zip(src, node.src, strict=True))
            else Node(node.op, src, node.arg, name=node.name, span=node.span)
        )
        rebuilt = simplify_node(rebuilt)
        if rebuilt.name is None and node.name is not None and rebuilt is not node:
            rebuilt = rebuilt.replace(name=node.name)
        existing = interned.setdefault(rebuilt, rebuilt)
        memo[node] = existing
    return [memo[r] for r in roots]
