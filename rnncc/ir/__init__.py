"""The cell IR: one uniform expression node, one op table, frozen declarations.

``node`` (the expression DAG), ``ops`` (the op table), ``cell`` (Cell, BackwardCell and the
declarations), ``simplify`` (folding and CSE), ``schedule`` (straight-line bindings),
``printer`` (surface syntax), ``verify`` (invariants), ``interpret`` (the torch oracle).
"""

from __future__ import annotations

from collections import Counter

from rnncc.ir.cell import BackwardCell, Cell, Const, Gate, Param, Projection, State
from rnncc.ir.node import Node, toposort
from rnncc.ir.ops import OPS

__all__ = [
    "OPS",
    "BackwardCell",
    "Cell",
    "Const",
    "Gate",
    "Node",
    "Param",
    "Projection",
    "State",
    "op_counts",
    "toposort",
]


def op_counts(cell: Cell) -> dict[str, int]:
    """How many nodes of each op one forward step evaluates (after CSE), leaves included."""
    counts = Counter(n.op for n in toposort([node for _, node in cell.updates]))
    return dict(counts)
