"""The uniform expression node of the cell IR.

One frozen node type for every expression: ``Node(op, src, arg)``. ``op`` names a row of the
op table (``rnncc.ir.ops``), ``src`` holds the operands, ``arg`` the payload of leaves and of
``pow`` (a constant's value, a leaf's name, the exponent). Traversal, CSE, folding and
autodiff are therefore generic.

Invariants: nodes are immutable; equality and hashing are structural over ``(op, src, arg)``
and ignore the ``name`` hint (the user's temporary name, kept for readable output) and the
source ``span``. The hash is computed once, so DAGs with heavy sharing stay cheap to compare.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from rnncc.errors import Span


def _arg_key(arg: Any) -> Any:
    # -0.0 == 0.0 in Python but they are different constants; NaN must equal itself.
    if isinstance(arg, float):
        return ("f", math.copysign(1.0, arg), abs(arg)) if not math.isnan(arg) else ("nan",)
    return arg


class Node:
    """An immutable expression node; see the module docstring."""

    __slots__ = ("_hash", "arg", "name", "op", "span", "src")

    _hash: int
    op: str
    src: tuple[Node, ...]
    arg: Any
    name: str | None
    span: Span | None

    def __init__(
        self,
        op: str,
        src: tuple[Node, ...] = (),
        arg: Any = None,
        *,
        name: str | None = None,
        span: Span | None = None,
    ) -> None:
        setattr_ = object.__setattr__
        setattr_(self, "op", op)
        setattr_(self, "src", tuple(src))
        setattr_(self, "arg", arg)
        setattr_(self, "name", name)
        setattr_(self, "span", span)
        setattr_(self, "_hash", hash((op, _arg_key(arg), tuple(hash(s) for s in src))))

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError("Node is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        # pickle and copy rebuild a node through __init__: the default path sets each slot
        # with setattr, which an immutable node refuses.
        return (_rebuild, (self.op, self.src, self.arg, self.name, self.span))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        """Structural equality, walked with an explicit stack: a sum of thousands of terms is
        a DAG thousands of levels deep. Pairs already matched are not compared again, so
        shared subexpressions cost once."""
        if self is other:
            return True
        if not isinstance(other, Node):
            return False
        stack: list[tuple[Node, Node]] = [(self, other)]
        matched: set[tuple[int, int]] = set()
        while stack:
            a, b = stack.pop()
            if a is b or (id(a), id(b)) in matched:
                continue
            if (
                a._hash != b._hash
                or a.op != b.op
                or _arg_key(a.arg) != _arg_key(b.arg)
                or len(a.src) != len(b.src)
            ):
                return False
            matched.add((id(a), id(b)))
            stack.extend(zip(a.src, b.src))
        return True

    def __repr__(self) -> str:
        if not self.src:
            return f"{self.op}({self.arg!r})"
        inner = ", ".join(repr(s) for s in self.src)
        extra = f", arg={self.arg!r}" if self.arg is not None else ""
        return f"{self.op}({inner}{extra})"

    def replace(self, **changes: Any) -> Node:
        """A copy with some of ``op, src, arg, name, span`` changed."""
        fields = {"op": self.op, "src": self.src, "arg": self.arg}
        fields.update({k: v for k, v in changes.items() if k in fields})
        return Node(
            fields["op"],
            fields["src"],
            fields["arg"],
            name=changes.get("name", self.name),
            span=changes.get("span", self.span),
        )

    @property
    def is_leaf(self) -> bool:
        return not self.src


def _rebuild(op: str, src: tuple[Node, ...], arg: Any, name: str | None, span: Span | None) -> Node:
    return Node(op, src, arg, name=name, span=span)


def toposort(roots: tuple[Node, ...] | list[Node]) -> list[Node]:
    """Every node reachable from ``roots``, operands before users, each once (by identity of
    structure: equal nodes count once), in a deterministic order."""
    seen: set[Node] = set()
    order: list[Node] = []
    for root in roots:
        if root in seen:
            continue
        stack: list[tuple[Node, int]] = [(root, 0)]
        while stack:
            node, i = stack.pop()
            if i < len(node.src):
                stack.append((node, i + 1))
                child = node.src[i]
                if child not in seen:
                    stack.append((child, 0))
            elif node not in seen:
                seen.add(node)
                order.append(node)
    return order


def walk(roots: tuple[Node, ...] | list[Node]) -> Iterator[Node]:
    """Iterate over the nodes reachable from ``roots`` in topological order."""
    return iter(toposort(roots))
