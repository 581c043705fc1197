"""Straight-line schedules of expression DAGs, shared by the printer and the code generator.

Input: named roots (the values a step must produce). Output: an ordered list of bindings
``(name, node)`` such that every node used more than once, and every node the user named
(a temporary of the source), is bound once before its first use, and optionally every node
whose inlined expression would nest too deep; everything else is inlined.
Names are the user's where free, else derived from them (``t_1``), else ``t<n>``.
Deterministic: the same DAG gives the same schedule.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from rnncc.ir.node import Node, toposort
from rnncc.ir.ops import OPS


@dataclass(frozen=True)
class Schedule:
    bindings: tuple[tuple[str, Node], ...]  # in evaluation order
    names: dict[Node, str]  # bound node -> its name

    def name_of(self, node: Node) -> str | None:
        return self.names.get(node)


class NameAllocator:
    """Hands out identifiers that collide neither with ``taken`` nor with each other."""

    def __init__(self, taken: set[str] | frozenset[str] = frozenset()):
        self.taken = set(taken)
        self._counter = 0

    def fresh(self, hint: str | None) -> str:
        if hint and hint not in self.taken:
            self.taken.add(hint)
            return hint
        if hint:
            i = 1
            while f"{hint}_{i}" in self.taken:
                i += 1
            self.taken.add(f"{hint}_{i}")
            return f"{hint}_{i}"
        while f"t{self._counter}" in self.taken:
            self._counter += 1
        name = f"t{self._counter}"
        self.taken.add(name)
        return name


def use_counts(
    roots: list[Node] | tuple[Node, ...], order: list[Node] | None = None
) -> Counter[Node]:
    """How many times each node is used: as an operand, or as a root. ``order`` is
    ``toposort(roots)`` when the caller has it already."""
    counts: Counter[Node] = Counter()
    for node in toposort(list(roots)) if order is None else order:
        for s in node.src:
            counts[s] += 1
    for r in roots:
        counts[r] += 1
    return counts


def schedule(
    roots: list[Node] | tuple[Node, ...],
    allocator: NameAllocator,
    *,
    bind_roots: bool = False,
    max_depth: int | None = None,
    root_names: dict[Node, str] | None = None,
) -> Schedule:
    """Bind shared and user-named interior nodes (and, with ``bind_roots``, every root that is
    not a leaf; with ``max_depth``, every node whose inlined expression would nest that many
    operators) in topological order; see the module docstring. Comparisons are never bound:
    the language allows them only inside ``where``, and they are cheap to repeat. A bound
    root takes its name from ``root_names`` where given (the caller's name for the value it
    produces), which the allocator must not hand out."""
    order = toposort(list(roots))
    counts = use_counts(roots, order)
    root_set = set(roots)
    bindings: list[tuple[str, Node]] = []
    names: dict[Node, str] = {}
    depth: dict[Node, int] = {}  # how deep the node's inlined expression nests
    for node in order:
        if node.is_leaf:
            depth[node] = 0
            continue
        depth[node] = 1 + max(0 if s in names else depth[s] for s in node.src)
        if OPS[node.op].kind == "compare":
            continue
        shared = counts[node] > 1
        named = node.name is not None
        deep = max_depth is not None and depth[node] >= max_depth
        if shared or named or deep or (bind_roots and node in root_set):
            given = (root_names or {}).get(node)
            name = given if given is not None else allocator.fresh(node.name)
            names[node] = name
            bindings.append((name, node))
    return Schedule(tuple(bindings), names)
