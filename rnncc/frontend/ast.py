"""The abstract syntax tree of a ``.rnn`` file: frozen nodes, each with its source span.

Produced by ``rnncc.frontend.parse`` from the Lark tree; consumed by the checker/lowering in
``rnncc.frontend.lower``. It mirrors the text closely (statement order, the user's names,
unresolved references); meaning is assigned only by lowering.
"""

from __future__ import annotations

from dataclasses import dataclass

from rnncc.errors import Span


@dataclass(frozen=True)
class Ident:
    name: str
    span: Span


# ---- expressions -------------------------------------------------------------------------
@dataclass(frozen=True)
class Number:
    """A number as written (``text``, with its sign in a declaration) and its float64 value;
    the lowering checks that the kernels' float32 can hold it."""

    value: float
    span: Span
    text: str


@dataclass(frozen=True)
class Name:
    ident: Ident

    @property
    def span(self) -> Span:
        return self.ident.span


@dataclass(frozen=True)
class Neg:
    operand: Expr
    span: Span


@dataclass(frozen=True)
class Binary:
    op: str  # + - * / **
    left: Expr
    right: Expr
    span: Span


@dataclass(frozen=True)
class Compare:
    op: str  # < <= > >= == !=
    left: Expr
    right: Expr
    span: Span


@dataclass(frozen=True)
class Call:
    func: Ident
    args: tuple[Expr, ...]
    span: Span


Expr = Number | Name | Neg | Binary | Compare | Call


# ---- statements --------------------------------------------------------------------------
@dataclass(frozen=True)
class Term:
    """One term of a projection as written: ``W x`` / ``R h`` (two words) or ``b`` (one)."""

    words: tuple[Ident, ...]
    span: Span


@dataclass(frozen=True)
class Projection:
    keyword: str
    names: tuple[Ident, ...]
    terms: tuple[Term, ...]
    span: Span


@dataclass(frozen=True)
class InitItem:
    name: Ident
    value: Number | None
    span: Span


@dataclass(frozen=True)
class ParamDecl:
    items: tuple[InitItem, ...]
    span: Span


@dataclass(frozen=True)
class ConstDecl:
    items: tuple[InitItem, ...]
    span: Span


@dataclass(frozen=True)
class OutputDecl:
    names: tuple[Ident, ...]
    span: Span


@dataclass(frozen=True)
class Assign:
    target: Ident
    value: Expr
    span: Span


Stmt = Projection | ParamDecl | ConstDecl | OutputDecl | Assign


@dataclass(frozen=True)
class CellDef:
    name: Ident
    states: tuple[InitItem, ...]
    body: tuple[Stmt, ...]
    span: Span


@dataclass(frozen=True)
class Module:
    cells: tuple[CellDef, ...]


# ---- text, for RNNCC_DUMP_DIR ------------------------------------------------------------
def format_expr(e: Expr) -> str:
    """``e`` in surface syntax with every operation in parentheses, so that the text shows how
    the source parsed. Written from an explicit stack: a long sum nests thousands deep."""
    out: list[str] = []
    stack: list[Expr | str] = [e]  # what remains to write, the next piece last
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, Number):
            out.append(item.text)
        elif isinstance(item, Name):
            out.append(item.ident.name)
        elif isinstance(item, Neg):
            stack += [")", item.operand, "(-"]
        elif isinstance(item, Binary | Compare):
            stack += [")", item.right, f" {item.op} ", item.left, "("]
        else:
            pieces: list[Expr | str] = [f"{item.func.name}("]
            for i, arg in enumerate(item.args):
                pieces += [", ", arg] if i else [arg]
            stack += reversed([*pieces, ")"])
    return "".join(out)


def format_cell(cell: CellDef) -> str:
    """The syntax tree of one cell as text: a line per declaration and statement, with its
    span; expressions as ``format_expr`` writes them."""

    def init(item: InitItem) -> str:
        value = "" if item.value is None else f" = {item.value.text}"
        return f"{item.name.name}{value} @{item.span!r}"

    lines = [f"CellDef {cell.name.name} @{cell.span!r}", "  states:"]
    lines += [f"    InitItem {init(s)}" for s in cell.states]
    lines.append("  body:")
    for stmt in cell.body:
        at = f"@{stmt.span!r}"
        if isinstance(stmt, Projection):
            terms = " + ".join(" ".join(w.name for w in t.words) for t in stmt.terms)
            names = ", ".join(n.name for n in stmt.names)
            lines.append(f"    Projection {stmt.keyword} {names} = {terms} {at}")
        elif isinstance(stmt, ParamDecl | ConstDecl):
            items = ", ".join(init(i) for i in stmt.items)
            lines.append(f"    {type(stmt).__name__} {items} {at}")
        elif isinstance(stmt, OutputDecl):
            lines.append(f"    OutputDecl {', '.join(n.name for n in stmt.names)} {at}")
        else:
            lines.append(f"    Assign {stmt.target.name} = {format_expr(stmt.value)} {at}")
    return "\n".join(lines) + "\n"
