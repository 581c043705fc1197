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
    value: float
    span: Span


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
    value: float | None
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
