"""The IR verifier: the invariants every pass must preserve, checked explicitly.

``verify_cell`` and ``verify_backward`` raise ``InternalError`` (with the printed IR) when an
invariant fails; the tests run them after every pass. Invariants:

- every node's op is in the op table with the right arity and payload (``const`` and
  ``pow`` carry a float, leaves a declared name);
- comparisons appear only as the first operand of ``where``, whose first operand is one;
- names are unique across states, gates, params and consts; every state has exactly one
  update, in declaration order; outputs are distinct states;
- ``R`` is used iff the cell has a recurrent state, which is a declared state;
- a forward cell's leaves are ``const``, ``state``, ``gate``, ``param``; a backward cell's
  may also be ``dstate`` (any state) and ``dout`` (an output state).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from rnncc.errors import InternalError
from rnncc.ir.cell import PARTS, BackwardCell, Cell
from rnncc.ir.node import Node, toposort
from rnncc.ir.ops import OPS

FORWARD_LEAVES = frozenset({"const", "state", "gate", "param"})
BACKWARD_LEAVES = FORWARD_LEAVES | {"dstate", "dout"}


Describe = Callable[[], str]


def _fail(message: str, describe: Describe) -> None:
    raise InternalError(f"IR verification failed: {message}\n{describe()}")


def listing(title: str, results: Sequence[tuple[str, Node]]) -> str:
    """The DAG below ``results`` as numbered lines (``%3 = add(%1, %2)``), then the results:
    a form of the IR that prints whatever the nodes hold, however deep they nest."""
    order = toposort([n for _, n in results])
    index = {node: i for i, node in enumerate(order)}
    lines = [title]
    for i, n in enumerate(order):
        operands = ", ".join(f"%{index[s]}" for s in n.src)
        arg = "" if n.arg is None else (f", {n.arg!r}" if n.src else repr(n.arg))
        lines.append(f"  %{i} = {n.op}({operands}{arg})")
    lines += [f"  {name} = %{index[node]}" for name, node in results]
    return "\n".join(lines)


def _check_nodes(
    roots: Iterable[Node],
    allowed_leaves: frozenset[str],
    names: dict[str, set[str]],
    text: Describe,
) -> None:
    for node in toposort(list(roots)):
        row = OPS.get(node.op)
        if row is None:
            _fail(f"unknown op {node.op!r}", text)
            continue
        if row.kind == "leaf":
            if node.src:
                _fail(f"leaf {node.op} has operands", text)
            if node.op not in allowed_leaves:
                _fail(f"leaf {node.op} is not allowed here", text)
            if node.op == "const":
                if not isinstance(node.arg, float):
                    _fail(f"const payload {node.arg!r} is not a float", text)
            elif node.arg not in names.get(node.op, set()):
                _fail(f"{node.op} leaf names undeclared {node.arg!r}", text)
            continue
        if len(node.src) != row.arity:
            _fail(f"{node.op} has {len(node.src)} operands, expects {row.arity}", text)
        if node.op == "pow" and not isinstance(node.arg, float):
            _fail(f"pow exponent {node.arg!r} is not a float", text)
        for i, s in enumerate(node.src):
            is_cmp = OPS[s.op].kind == "compare"
            if node.op == "where" and i == 0 and not is_cmp:
                _fail("where's first operand is not a comparison", text)
            if is_cmp and not (node.op == "where" and i == 0):
                _fail(f"comparison {s.op} used outside where's condition", text)
    for r in roots:
        if OPS[r.op].kind == "compare":
            _fail("a comparison is a result", text)


def _declared(cell: Cell) -> dict[str, set[str]]:
    return {
        "state": set(cell.state_names),
        "gate": {g.name for g in cell.gates},
        "param": set(cell.param_names),
        "dstate": set(cell.state_names),
        "dout": set(cell.outputs),
    }


def verify_cell(cell: Cell) -> None:
    """Check a forward cell; see the module docstring."""
    from rnncc.ir.printer import print_cell

    def text() -> str:  # built only on a failure
        return listing(f"cell {cell.name}: updates", cell.updates)

    all_names = Counter(
        list(cell.state_names)
        + [g.name for g in cell.gates]
        + list(cell.param_names)
        + [c.name for c in cell.consts]
    )
    dupes = sorted(n for n, count in all_names.items() if count > 1)
    if dupes:
        _fail(f"duplicate names {dupes}", text)
    if tuple(s for s, _ in cell.updates) != cell.state_names:
        _fail("updates do not match the states one to one, in order", text)
    if len(set(cell.outputs)) != len(cell.outputs) or not set(cell.outputs) <= set(
        cell.state_names
    ):
        _fail(f"bad outputs {cell.outputs}", text)
    for proj in cell.projections:
        if (
            not proj.terms
            or not set(proj.terms) <= set(PARTS)
            or len(set(proj.terms)) != len(proj.terms)
        ):
            _fail(f"bad projection terms {proj.terms}", text)
    has_r = bool(cell.gr_names)
    if has_r != (cell.recurrent is not None):
        _fail("R terms and the recurrent state disagree", text)
    if cell.recurrent is not None and cell.recurrent not in cell.state_names:
        _fail(f"recurrent state {cell.recurrent!r} is not a state", text)
    _check_nodes([n for _, n in cell.updates], FORWARD_LEAVES, _declared(cell), text)
    # The printer must be able to print what passed; a crash there is a verifier failure too.
    print_cell(cell)


def verify_backward(bwd: BackwardCell) -> None:
    """Check a backward cell against its forward cell; see the module docstring."""
    cell = bwd.forward

    def text() -> str:  # built only on a failure
        return listing(f"backward of {cell.name}", bwd.d_states + bwd.d_gates + bwd.d_params)

    if tuple(s for s, _ in bwd.d_states) != cell.state_names:
        _fail("d_states do not match the states", text)
    if tuple(g for g, _ in bwd.d_gates) != tuple(g.name for g in cell.gates):
        _fail("d_gates do not match the gates", text)
    if tuple(p for p, _ in bwd.d_params) != cell.param_names:
        _fail("d_params do not match the params", text)
    _check_nodes(bwd.roots, BACKWARD_LEAVES, _declared(cell), text)
