"""Reverse-mode autodiff of one cell step: forward ``Cell`` → ``BackwardCell``.

The cotangent of each new state is seeded with its ``dstate`` leaf (the cotangent arriving
from later steps, the ``R`` path already added by the backend) plus, for an output state,
its ``dout`` leaf. Cotangents then flow through the update DAG in reverse topological order,
each op's derivative rule from the op table mapping a node's cotangent to its operands'
(summed where a node has several users), until they reach the leaves: old states, gates and
params. The result is ordinary IR: folded, CSE'd (forward subexpressions that the rules
reuse stay shared with the recomputed forward), verified by the same verifier.

Non-goals: higher derivatives (the backward cell is not differentiated again), cotangents of
constants.
"""

from __future__ import annotations

from rnncc.ir.cell import BackwardCell, Cell
from rnncc.ir.node import Node, toposort
from rnncc.ir.ops import OPS
from rnncc.ir.simplify import canonicalize

__all__ = ["derive_backward"]

_ZERO = Node("const", (), 0.0)


def _accumulate(cot: dict[Node, Node], node: Node, g: Node) -> None:
    previous = cot.get(node)
    cot[node] = g if previous is None else Node("add", (previous, g))


def derive_backward(cell: Cell) -> BackwardCell:
    """The backward cell of ``cell``; see the module docstring."""
    cot: dict[Node, Node] = {}
    for state, node in cell.updates:
        seed = Node("dstate", (), state)
        if state in cell.outputs:
            seed = Node("add", (seed, Node("dout", (), state)))
        _accumulate(cot, node, seed)

    for node in reversed(toposort([n for _, n in cell.updates])):
        g = cot.get(node)
        if g is None or node.is_leaf:
            continue
        rule = OPS[node.op].grad
        assert rule is not None, node.op
        for src, g_src in zip(node.src, rule(node, g), strict=True):
            if g_src is not None and src.op != "const":
                _accumulate(cot, src, g_src)

    def leaf_cot(op: str, name: str) -> Node:
        return cot.get(Node(op, (), name), _ZERO)

    d_states = [leaf_cot("state", s) for s in cell.state_names]
    d_gates = [leaf_cot("gate", g.name) for g in cell.gates]
    d_params = [leaf_cot("param", p) for p in cell.param_names]
    # The forward roots go first so that the backward reuses the forward's very nodes (CSE
    # keeps the first of equal nodes): a copy would be compared node by node wherever the
    # two DAGs meet, as in the package's one node table.
    forward = [n for _, n in cell.updates]
    roots = canonicalize(forward + d_states + d_gates + d_params)[len(forward) :]
    ns, ng = len(d_states), len(d_gates)
    return BackwardCell(
        forward=cell,
        d_states=tuple(zip(cell.state_names, roots[:ns], strict=True)),
        d_gates=tuple(zip((g.name for g in cell.gates), roots[ns : ns + ng], strict=True)),
        d_params=tuple(zip(cell.param_names, roots[ns + ng :], strict=True)),
    )
