"""The IR printed in the surface syntax of the language.

``print_cell(cell)`` gives source text that parses back to an equal ``Cell``
(``parse(print(ir)) == ir``): projections, params, consts, temporaries for shared or
user-named subexpressions, state assignments placed so that every read of a state's old value
comes before its assignment, and the ``output`` line. ``print_backward(bwd)`` prints the
derived reverse step in the same expression syntax, as a ``backward`` block that lists its
inputs; it is for reading (``rnncc show --backward``), not for parsing.

Expressions get the fewest parentheses that preserve the tree exactly: the left operand of
an infix op needs them only when it binds looser, the right one also when it binds equally
(the operators are left-associative, ``**`` right-associative).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from rnncc.ir.cell import BackwardCell, Cell
from rnncc.ir.node import Node
from rnncc.ir.ops import OPS, PREC_ATOM, PREC_NEG, PREC_POW
from rnncc.ir.schedule import NameAllocator, schedule

RESERVED = frozenset(
    {"W", "R", "x", "b", "inf", "cell", "gates", "input", "recurrent", "param", "const", "output"}
)
_TERM_TEXT = {"x": "W x", "b": "b"}


def format_number(value: float) -> str:
    """Shortest text that reads back as exactly ``value`` (``1``, ``0.5``, ``1e-06``, ``inf``)."""
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def _prec(node: Node, names: Mapping[Node, str]) -> int:
    if node in names or (node.is_leaf and node.op != "const"):
        return PREC_ATOM
    if node.op == "const":
        return PREC_NEG if (node.arg < 0 or str(node.arg).startswith("-")) else PREC_ATOM
    row = OPS[node.op]
    return row.prec


def render(
    node: Node, names: Mapping[Node, str], leaf: Callable[[Node], str], *, top: bool = True
) -> str:
    """``node`` as a surface expression; bound subexpressions print as their names. Written
    out piece by piece from an explicit stack: user expressions can nest thousands deep."""
    pieces = lambda n: _pieces(n, names, leaf)  # noqa: E731
    return write_out(pieces(node) if top else [node], names, pieces)


def write_out(
    first: list[Node | str],
    names: Mapping[Node, str],
    pieces: Callable[[Node], list[Node | str]],
) -> str:
    """The text of ``first``: strings as they are, named nodes as their names, other nodes
    as their ``pieces``, expanded from an explicit stack (no recursion, however deep the
    expression). The surface printer and the CUDA renderer both write through this."""
    out: list[str] = []
    stack = first[::-1]  # what remains to write, the next piece last
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
        elif item in names:
            out.append(names[item])
        else:
            stack.extend(reversed(pieces(item)))
    return "".join(out)


def _pieces(node: Node, names: Mapping[Node, str], leaf: Callable[[Node], str]) -> list[Node | str]:
    """``node``'s text as literal pieces and operands still to be written."""
    if node.op == "const":
        return [format_number(node.arg)]
    if node.is_leaf:
        return [leaf(node)]
    row = OPS[node.op]

    def sub(child: Node, min_prec: int) -> list[Node | str]:
        return ["(", child, ")"] if _prec(child, names) < min_prec else [child]

    if row.kind == "call":
        parts: list[Node | str] = [f"{row.symbol}("]
        for i, s in enumerate(node.src):
            parts += [", ", s] if i else [s]
        return [*parts, ")"]
    if node.op == "pow":
        return [*sub(node.src[0], PREC_POW + 1), f" ** {format_number(node.arg)}"]
    if row.kind == "prefix":
        operand = node.src[0]
        return [str(row.symbol), *sub(operand, row.prec + 1 if operand.op == "neg" else row.prec)]
    # infix and compare: left-associative
    left, right = node.src
    return [*sub(left, row.prec), f" {row.symbol} ", *sub(right, row.prec + 1)]


def _mentions(node: Node, names: Mapping[Node, str], *, top: bool) -> set[str]:
    """Names of the old states that ``render(node, names, top=top)`` mentions."""
    found: set[str] = set()
    stack = list(node.src) if top else [node]
    while stack:
        n = stack.pop()
        if n.op == "state":
            found.add(n.arg)
        elif n not in names:
            stack.extend(n.src)
    return found


def _state_list(cell: Cell) -> str:
    return ", ".join(
        s.name if s.init == 0.0 else f"{s.name} = {format_number(s.init)}" for s in cell.states
    )


def print_cell(cell: Cell) -> str:
    """Surface text of ``cell``; see the module docstring."""
    ind = "    "
    lines = [f"cell {cell.name}({_state_list(cell)}) {{"]
    for proj in cell.projections:
        terms = " + ".join(f"R {cell.recurrent}" if t == "r" else _TERM_TEXT[t] for t in proj.terms)
        lines.append(f"{ind}{proj.keyword} {', '.join(proj.gates)} = {terms}")
    if cell.params:
        items = [
            p.name if p.init == 0.0 else f"{p.name} = {format_number(p.init)}" for p in cell.params
        ]
        lines.append(f"{ind}param {', '.join(items)}")
    for c in cell.consts:
        lines.append(f"{ind}const {c.name} = {format_number(c.value)}")

    declared = set(cell.state_names) | {g.name for g in cell.gates} | set(cell.param_names)
    declared |= {c.name for c in cell.consts} | RESERVED
    roots = [node for _, node in cell.updates]
    alloc = NameAllocator(declared)
    sched = schedule(roots, alloc, bind_roots=False)
    names = dict(sched.names)
    leaf = lambda n: n.arg  # noqa: E731 - old states, gates and params print as their names

    # A bound update takes its state's own name when no later line reads the old value.
    # (Renaming changes no node's boundness, so what a line mentions is known up front.)
    body: list[tuple[str, Node]] = list(sched.bindings)
    inline_updates = [n for n in roots if n not in names]
    read_inline = set().union(*(_mentions(n, names, top=False) for n in inline_updates))
    last_read: dict[str, int] = {}  # state -> the last body line that reads its old value
    for i, (_, node) in enumerate(body):
        last_read.update(dict.fromkeys(_mentions(node, names, top=True), i))
    state_of: dict[Node, str] = {}
    for s, n in cell.updates:
        state_of.setdefault(n, s)
    for i, (_, node) in enumerate(body):
        state = state_of.get(node)  # bound, so not one of the inline updates
        if state is not None and state not in read_inline and last_read.get(state, -1) <= i:
            names[node] = state
            body[i] = (state, node)
    for name, node in body:
        lines.append(f"{ind}{name} = {render(node, names, leaf)}")

    # The other assignments come last. One whose value reads a state that another of them
    # assigns is computed into a temporary first, so every read sees the old value.
    pending = [(s, n) for s, n in cell.updates if names.get(n) != s]
    assigned = {s for s, _ in pending}
    rhs: dict[str, str] = {}
    for s, n in pending:
        text = render(n, names, leaf, top=False)
        if (_mentions(n, names, top=False) & assigned) - {s}:
            tmp = alloc.fresh(f"{s}_new")
            lines.append(f"{ind}{tmp} = {text}")
            text = tmp
        rhs[s] = text
    for s, _ in pending:
        lines.append(f"{ind}{s} = {rhs[s]}")
    lines.append(f"{ind}output {', '.join(cell.outputs)}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def backward_leaf_name(node: Node) -> str:
    """Names of the backward cell's inputs: old states, gates and params by their own names,
    ``d<s>_new`` for the cotangent of a new state, ``d<s>_out`` for that of an output."""
    if node.op == "dstate":
        return f"d{node.arg}_new"
    if node.op == "dout":
        return f"d{node.arg}_out"
    return str(node.arg)


def print_backward(bwd: BackwardCell) -> str:
    """Readable text of a backward cell; see the module docstring."""
    cell = bwd.forward
    ind = "    "
    inputs = [
        ("old states", ", ".join(cell.state_names)),
        ("gates", ", ".join(g.name for g in cell.gates)),
        ("params", ", ".join(cell.param_names)),
        ("cotangents of the new states", ", ".join(f"d{s}_new" for s in cell.state_names)),
        ("cotangents of the outputs", ", ".join(f"d{s}_out" for s in cell.outputs)),
    ]
    lines = [f"# backward of cell {cell.name}: one reverse step"]
    lines += [f"#   {what}: {names}" for what, names in inputs if names]
    lines.append(f"backward {cell.name} {{")
    outputs = bwd.d_states + bwd.d_gates + bwd.d_params
    taken = set(cell.state_names) | {g.name for g in cell.gates} | set(cell.param_names)
    taken |= {f"d{s}_new" for s in cell.state_names} | {f"d{s}_out" for s in cell.outputs}
    alloc = NameAllocator(taken)
    out_names = [alloc.fresh(f"d{name}") for name, _ in outputs]
    sched = schedule([n for _, n in outputs], alloc)
    for name, node in sched.bindings:
        lines.append(f"{ind}{name} = {render(node, sched.names, backward_leaf_name)}")
    for name, (_, node) in zip(out_names, outputs, strict=True):
        lines.append(f"{ind}{name} = {render(node, sched.names, backward_leaf_name, top=False)}")
    lines.append("}")
    return "\n".join(lines) + "\n"
