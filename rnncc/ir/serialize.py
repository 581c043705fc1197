"""The cell IR as JSON: what a compiled package stores so that importing it runs no front end.

``dump_cells(cell, backward)`` → a JSON-able dict; ``load_cells(data)`` → ``(Cell, BackwardCell)``
equal to the originals. Nodes are stored once each, operands before users, as
``[op, [operand indices], arg, name]``; spans are not stored. The format carries a version
(``FORMAT``); an unknown one is refused rather than misread.
"""

from __future__ import annotations

from typing import Any

from rnncc.errors import RnnccError, Source
from rnncc.ir.cell import BackwardCell, Cell, Const, Param, Projection, State
from rnncc.ir.node import Node, toposort
from rnncc.ir.ops import LEAVES, OPS

FORMAT = "rnncc-ir/1"


def dump_cells(cell: Cell, backward: BackwardCell) -> dict[str, Any]:
    """Serialise a forward cell and its backward cell; see the module docstring."""
    roots = [n for _, n in cell.updates] + list(backward.roots)
    order = toposort(roots)
    index = {node: i for i, node in enumerate(order)}
    nodes = [[n.op, [index[s] for s in n.src], n.arg, n.name] for n in order]
    ref = lambda pairs: [[name, index[node]] for name, node in pairs]  # noqa: E731
    return {
        "format": FORMAT,
        "name": cell.name,
        "states": [[s.name, s.init] for s in cell.states],
        "projections": [[p.keyword, list(p.gates), list(p.terms)] for p in cell.projections],
        "params": [[p.name, p.init] for p in cell.params],
        "consts": [[c.name, c.value] for c in cell.consts],
        "recurrent": cell.recurrent,
        "outputs": list(cell.outputs),
        "nodes": nodes,
        "updates": ref(cell.updates),
        "backward": {
            "d_states": ref(backward.d_states),
            "d_gates": ref(backward.d_gates),
            "d_params": ref(backward.d_params),
        },
        "source": cell.source.text if cell.source else None,
        "path": cell.source.path if cell.source else None,
    }


def _check_names(data: dict[str, Any]) -> None:
    """Every name that generated code spells (cells, states, gates, params, consts, leaves,
    temporaries) must be an identifier, and every op one of the table's: a hand-edited
    ``cell.json`` must not put code into the kernels' sources."""
    names = [data["name"], *data["outputs"]]
    names += [n for n, _ in data["states"] + data["params"] + data["consts"]]
    names += [g for _, gates, _ in data["projections"] for g in gates]
    names += [data["recurrent"]] if data["recurrent"] is not None else []
    for op, _, arg, name in data["nodes"]:
        if op not in OPS:
            raise RnnccError(f"compiled cell: unknown op {op!r}: recompile it with `rnncc compile`")
        names += [name] if name is not None else []
        names += [arg] if op in LEAVES and isinstance(arg, str) else []
    bad = next((n for n in names if not (isinstance(n, str) and n.isidentifier())), None)
    if bad is not None:
        raise RnnccError(
            f"compiled cell: {bad!r} is not an identifier: recompile it with `rnncc compile`"
        )


def load_cells(data: dict[str, Any]) -> tuple[Cell, BackwardCell]:
    """Rebuild ``(Cell, BackwardCell)`` from ``dump_cells`` output."""
    if data.get("format") != FORMAT:
        raise RnnccError(
            f"compiled cell has format {data.get('format')!r}; this rnncc reads {FORMAT!r}: "
            "recompile it with `rnncc compile`"
        )
    _check_names(data)
    nodes: list[Node] = []
    for op, src, arg, name in data["nodes"]:
        nodes.append(Node(op, tuple(nodes[i] for i in src), arg, name=name))
    pairs = lambda items: tuple((name, nodes[i]) for name, i in items)  # noqa: E731
    source = Source(data["source"], data["path"]) if data.get("source") is not None else None
    cell = Cell(
        name=data["name"],
        states=tuple(State(n, float(v)) for n, v in data["states"]),
        projections=tuple(Projection(k, tuple(g), tuple(t)) for k, g, t in data["projections"]),
        params=tuple(Param(n, float(v)) for n, v in data["params"]),
        consts=tuple(Const(n, float(v)) for n, v in data["consts"]),
        recurrent=data["recurrent"],
        updates=pairs(data["updates"]),
        outputs=tuple(data["outputs"]),
        source=source,
    )
    bwd = data["backward"]
    backward = BackwardCell(
        forward=cell,
        d_states=pairs(bwd["d_states"]),
        d_gates=pairs(bwd["d_gates"]),
        d_params=pairs(bwd["d_params"]),
    )
    return cell, backward
