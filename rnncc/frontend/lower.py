"""AST → cell IR, with every semantic check of the language.

Input: a parsed ``ast.Module`` and its ``Source``. Output: one ``rnncc.ir.Cell`` per cell
block, plus warnings; or ``DslError`` carrying every error of the file (and the warnings),
each with file:line:col, the source line and a caret.

Checks: reserved words as names; duplicate names (states, gates, params, consts,
temporaries, cells); projection statements after an assignment; projection terms other than
``W x``, ``R <state>``, ``b`` (repeated in one statement, ``R`` on a non-state, ``R`` on two
different states); unknown names and functions (with a "did you mean"); wrong arity;
comparisons outside the first argument of ``where``; a non-constant ``**`` exponent; a state
never assigned or assigned twice; assignments to gates, params or consts; ``const`` without a
value; bad ``output`` lists; numbers that float32 would hold as inf or 0; cell names longer
than ``MAX_CELL_NAME``. Warnings: gates, params and temporaries never used. Expressions are
walked iteratively, so their depth has no limit.

Semantics: statements run in order, so a state read before its assignment is the previous
step's value (a ``state`` leaf) and after it the new value (the assigned expression).
Temporaries and consts are substituted; the result is folded and CSE'd.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from rnncc.errors import Diagnostic, DslError, Source, Span
from rnncc.frontend import ast
from rnncc.ir.cell import Cell, Const, Param, Projection, State
from rnncc.ir.node import Node, toposort
from rnncc.ir.ops import BINARY, COMPARISONS, FUNCTIONS
from rnncc.ir.simplify import canonicalize, to_float32

#: Names the language reserves beyond the lexer's keywords, and why.
RESERVED_NAMES = {
    "W": "'W' is reserved for the input weights (as in 'W x')",
    "R": "'R' is reserved for the recurrent weights (as in 'R h')",
    "x": "'x' is reserved for the input (as in 'W x')",
    "b": "'b' is reserved for the bias (as in '+ b')",
}

#: The longest cell name: it names the generated sources and libraries
#: ("{name}_grid_sparse_d4224.cu", "rnncc_{name}_..."), which must fit the file system's
#: 255 bytes a name.
MAX_CELL_NAME = 64


@dataclass
class _Decl:
    kind: str  # state | gate | param | const | temporary (the word used in messages)
    span: Span
    used: bool = False


def _did_you_mean(name: str, candidates: list[str]) -> tuple[str, ...]:
    close = difflib.get_close_matches(name, sorted(set(candidates)), n=1, cutoff=0.6)
    return (f"did you mean '{close[0]}'?",) if close else ()


class _CellLowering:
    """Checks and lowers one cell, collecting diagnostics instead of stopping at the first."""

    def __init__(self, cell: ast.CellDef, source: Source):
        self.cell = cell
        self.source = source
        self.diags: list[Diagnostic] = []
        self.decls: dict[str, _Decl] = {}
        self.env: dict[str, Node] = {}
        self.states: list[State] = []
        self.assigned: dict[str, Span] = {}
        self.projections: list[Projection] = []
        self.params: list[Param] = []
        self.consts: list[Const] = []
        self.recurrent: tuple[str, Span] | None = None
        self.outputs: tuple[str, ...] | None = None
        # name -> where a statement first binds it (an assignment, or a gate, param or const
        # declared), for "bound later" notes; names read before that, whose "never used"
        # warning would contradict the error
        self.bound_at: dict[str, Span] = {}
        self.bound_by: dict[str, Span] = {}  # the assignment that binds it, whole
        self.read_early: set[str] = set()
        for stmt in cell.body:
            idents: tuple[ast.Ident, ...] = ()
            if isinstance(stmt, ast.Assign):
                idents = (stmt.target,)
                self.bound_by.setdefault(stmt.target.name, stmt.span)
            elif isinstance(stmt, ast.Projection):
                idents = stmt.names
            elif isinstance(stmt, ast.ParamDecl | ast.ConstDecl):
                idents = tuple(item.name for item in stmt.items)
            for ident in idents:
                self.bound_at.setdefault(ident.name, ident.span)

    # ---- diagnostics ---------------------------------------------------------------------
    def error(self, span: Span | None, message: str, *notes: str) -> None:
        self.diags.append(Diagnostic("error", message, span, self.source, tuple(notes)))

    def warning(self, span: Span, message: str, *notes: str) -> None:
        self.diags.append(Diagnostic("warning", message, span, self.source, tuple(notes)))

    def at(self, span: Span) -> str:
        return f"{self.source.path}:{span.line}:{span.col}"

    # ---- declarations --------------------------------------------------------------------
    def declare(self, ident: ast.Ident, kind: str) -> bool:
        name = ident.name
        if name in RESERVED_NAMES:
            self.error(ident.span, f"{RESERVED_NAMES[name]} and cannot name a {kind}")
            return False
        previous = self.decls.get(name)
        if previous is not None:
            self.error(
                ident.span,
                f"duplicate name '{name}': already declared as a {previous.kind}",
                f"first declared at {self.at(previous.span)}",
            )
            return False
        self.decls[name] = _Decl(kind, ident.span)
        return True

    # ---- statements ----------------------------------------------------------------------
    def run(self) -> Cell | None:
        cell = self.cell
        for item in cell.states:
            init = self.init_value(item)
            if self.declare(item.name, "state"):
                self.states.append(State(item.name.name, init))
                self.env[item.name.name] = Node("state", (), item.name.name)
        if not cell.states:
            self.error(
                cell.name.span,
                f"cell '{cell.name.name}' has no states",
                "declare them: cell name(h, c)",
            )
        if len(cell.name.name) > MAX_CELL_NAME:
            self.error(
                cell.name.span,
                f"the cell's name is {len(cell.name.name)} characters long, at most "
                f"{MAX_CELL_NAME}",
                "it names the generated files and libraries (lstm_grid_mma_d768.cu), whose "
                "names the file system limits",
            )

        first_assign: Span | None = None
        for stmt in cell.body:
            if isinstance(stmt, ast.Projection):
                if first_assign is not None:
                    self.error(
                        stmt.span,
                        "projection statements must come before any assignment",
                        f"first assignment at {self.at(first_assign)}",
                    )
                self.projection(stmt)
            elif isinstance(stmt, ast.ParamDecl):
                self.param_decl(stmt)
            elif isinstance(stmt, ast.ConstDecl):
                self.const_decl(stmt)
            elif isinstance(stmt, ast.OutputDecl):
                self.output_decl(stmt)
            else:
                first_assign = first_assign or stmt.span
                self.assign(stmt)

        for state in self.states:
            if state.name not in self.assigned:
                self.error(
                    self.decls[state.name].span,
                    f"state '{state.name}' is never assigned",
                    "every state must be assigned exactly once per step",
                )
        for name, decl in self.decls.items():
            if (
                not decl.used
                and decl.kind in ("gate", "param", "temporary")
                and name not in self.read_early
            ):
                self.warning(decl.span, f"{decl.kind} '{name}' is never used")

        if any(d.severity == "error" for d in self.diags):
            return None
        return self.build()

    def projection(self, stmt: ast.Projection) -> None:
        terms: list[str] = []
        for term in stmt.terms:
            part = self.term(term)
            if part is None:
                continue
            if part in terms:
                self.error(
                    term.span, f"the term '{_term_text(term)}' appears twice in this projection"
                )
                continue
            terms.append(part)
        gates = tuple(ident.name for ident in stmt.names if self.declare(ident, "gate"))
        for name in gates:
            self.env[name] = Node("gate", (), name)
        if terms:
            self.projections.append(Projection(stmt.keyword, gates, tuple(terms)))

    def term(self, term: ast.Term) -> str | None:
        words = [w.name for w in term.words]
        if words == ["W", "x"]:
            return "x"
        if words == ["b"]:
            return "b"
        if len(words) == 2 and words[0] == "W":
            self.error(term.words[1].span, "W multiplies only the input: write 'W x'")
            return None
        if len(words) == 2 and words[0] == "R":
            state = term.words[1]
            decl = self.decls.get(state.name)
            if decl is None or decl.kind != "state":
                states = [s.name for s in self.states]
                self.error(
                    state.span,
                    f"R must multiply a state of cell '{self.cell.name.name}'; '{state.name}' is not one",
                    *_did_you_mean(state.name, states),
                )
                return None
            if self.recurrent is not None and self.recurrent[0] != state.name:
                first, span = self.recurrent
                self.error(
                    state.span,
                    f"all R terms of a cell must multiply the same state; this one names "
                    f"'{state.name}', an earlier one '{first}'",
                    f"first R term at {self.at(span)}",
                )
                return None
            self.recurrent = self.recurrent or (state.name, state.span)
            return "r"
        self.error(
            term.span,
            f"expected a projection term ('W x', 'R <state>' or 'b'), found '{_term_text(term)}'",
        )
        return None

    def init_value(self, item: ast.InitItem) -> float:
        """The declared initial value of a state or param (0 when none is written)."""
        return 0.0 if item.value is None else self.number(item.value)

    def param_decl(self, stmt: ast.ParamDecl) -> None:
        for item in stmt.items:
            init = self.init_value(item)
            if self.declare(item.name, "param"):
                self.params.append(Param(item.name.name, init))
                self.env[item.name.name] = Node("param", (), item.name.name)

    def const_decl(self, stmt: ast.ConstDecl) -> None:
        for item in stmt.items:
            if item.value is None:
                self.error(
                    item.span,
                    f"const '{item.name.name}' needs a value",
                    f"write: const {item.name.name} = 1.0",
                )
                if self.declare(item.name, "const"):  # known, so its uses are no errors too
                    self.env[item.name.name] = _BAD
                continue
            value = self.number(item.value)
            if self.declare(item.name, "const"):
                self.consts.append(Const(item.name.name, value))
                self.env[item.name.name] = Node("const", (), value)

    def output_decl(self, stmt: ast.OutputDecl) -> None:
        if self.outputs is not None:
            self.error(stmt.span, "a cell has at most one output statement")
            return
        names: list[str] = []
        for ident in stmt.names:
            decl = self.decls.get(ident.name)
            if decl is None or decl.kind != "state":
                self.error(
                    ident.span,
                    f"output '{ident.name}' is not a state of cell '{self.cell.name.name}'",
                    *_did_you_mean(ident.name, [s.name for s in self.states]),
                )
            elif ident.name in names:
                self.error(ident.span, f"output '{ident.name}' is listed twice")
            else:
                names.append(ident.name)
        self.outputs = tuple(names)

    def assign(self, stmt: ast.Assign) -> None:
        target = stmt.target
        name = target.name
        decl = self.decls.get(name)
        value = self.expr(stmt.value)
        if name in RESERVED_NAMES:
            self.error(target.span, f"{RESERVED_NAMES[name]} and cannot be assigned")
            return
        if decl is None:
            self.decls[name] = _Decl("temporary", target.span)
            if not value.is_leaf and value.name is None:
                value = value.replace(name=name)
            self.env[name] = value
        elif decl.kind == "state":
            if name in self.assigned:
                self.error(
                    target.span,
                    f"state '{name}' is assigned twice",
                    f"first assigned at {self.at(self.assigned[name])}",
                )
                return
            self.assigned[name] = target.span
            self.env[name] = value
        elif decl.kind == "temporary":
            self.error(
                target.span,
                f"'{name}' is already bound; a temporary is bound once",
                f"first bound at {self.at(decl.span)}",
            )
        else:
            self.error(
                target.span,
                f"cannot assign to {decl.kind} '{name}'",
                f"'{name}' is declared at {self.at(decl.span)}",
            )

    # ---- expressions ---------------------------------------------------------------------
    def expr(self, root: ast.Expr) -> Node:
        """Check and lower one expression. The syntax tree is walked with an explicit stack of
        work (a sum of thousands of terms nests thousands deep): each node is checked when it
        is reached, and built once its operands are."""
        done: list[Node] = []  # lowered operands, the latest last
        work: list[tuple[ast.Expr, bool] | _Build] = [(root, False)]
        while work:
            item = work.pop()
            if isinstance(item, _Build):
                start = len(done) - item.arity
                args = tuple(done[start:])
                del done[start:]
                done.append(item.build(args))
                continue
            step = self.visit(*item)
            if isinstance(step, Node):
                done.append(step)
            else:
                work.append(step)
                work.extend(reversed(step.operands))
        return done[0]

    def visit(self, e: ast.Expr, compare_ok: bool) -> Node | _Build:
        """``e`` itself checked: a leaf's node, or how to build ``e`` from its operands."""
        if isinstance(e, ast.Number):
            return Node("const", (), self.number(e), span=e.span)
        if isinstance(e, ast.Name):
            return self.name(e.ident) or _BAD
        if isinstance(e, ast.Neg):
            return _Build.of(lambda a: Node("neg", a, span=e.span), e.operand)
        if isinstance(e, ast.Compare):
            if not compare_ok:
                self.error(
                    e.span,
                    f"comparison '{e.op}' is only allowed as the first argument of where()",
                    "for example: where(n == 0, a, b)",
                )
            op = COMPARISONS[e.op].name
            return _Build.of(lambda a: Node(op, a, span=e.span), e.left, e.right)
        if isinstance(e, ast.Binary):
            if e.op == "**":
                return _Build.of(lambda a: self.power(e, *a), e.left, e.right)
            op = BINARY[e.op].name
            return _Build.of(lambda a: Node(op, a, span=e.span), e.left, e.right)
        return self.call(e)

    def number(self, num: ast.Number) -> float:
        """The value of a number, which must not become inf or 0 where the kernels hold it."""
        if num.text.lstrip("+-") == "inf":
            return num.value
        single = to_float32(num.value)  # float64 made it inf or 0 already if it is that far out
        mantissa = re.split("[eE]", num.text)[0]
        if math.isinf(single):
            self.error(
                num.span,
                f"number '{num.text}' is too large for float32: it would be inf",
                "the kernels compute in float32 (largest finite value about 3.4e38); "
                "write inf for infinity",
            )
        elif single == 0.0 and re.search("[1-9]", mantissa):
            self.error(
                num.span,
                f"number '{num.text}' is too close to zero for float32: it would be 0",
                "the kernels compute in float32 (smallest positive value about 1.4e-45); "
                "write 0 for zero",
            )
        return num.value

    def power(self, e: ast.Binary, base: Node, exponent: Node) -> Node:
        """``base ** exponent``: the exponent must fold to a number (the IR's ``pow`` holds a
        constant exponent)."""
        folded = canonicalize([exponent])[0]
        if folded.op != "const":
            if all(n.op == "const" for n in toposort([folded]) if n.is_leaf):
                self.error(
                    e.right.span,
                    "the exponent of '**' must fold to a number; this one is NaN, or float32 "
                    "would make it inf or 0",
                )
            else:
                self.error(
                    e.right.span,
                    "the exponent of '**' must be a constant (a number or a const)",
                )
            return _BAD
        return Node("pow", (base,), float(folded.arg), span=e.span)

    def name(self, ident: ast.Ident) -> Node | None:
        name = ident.name
        if name in RESERVED_NAMES:
            self.error(ident.span, f"{RESERVED_NAMES[name]} and cannot appear in an expression")
            return None
        decl = self.decls.get(name)
        if decl is None or name not in self.env:
            visible = [n for n in self.env if n not in RESERVED_NAMES]
            notes = _did_you_mean(name, visible)
            later = self.bound_at.get(name)
            at = (ident.span.line, ident.span.col)
            whole = self.bound_by.get(name)
            if later is not None and (later.line, later.col) > at:
                notes += (f"'{name}' is bound later, at {self.at(later)}",)
                self.read_early.add(name)
            elif whole is not None and (whole.line, whole.col) <= at <= (
                whole.end_line,
                whole.end_col,
            ):
                notes += (f"'{name}' is bound by this assignment, which cannot read it",)
            self.error(ident.span, f"unknown name '{name}'", *notes)
            return None
        decl.used = True
        return self.env[name]

    def call(self, e: ast.Call) -> _Build:
        """A call checked (a known function, its argument count, ``where``'s comparison), and
        how to build it from its lowered arguments."""
        fname = e.func.name
        row = FUNCTIONS.get(fname)
        if row is None:
            decl = self.decls.get(fname)
            if decl is not None:
                decl.used = True  # it is referred to; a "never used" warning would mislead
                self.error(e.func.span, f"'{fname}' is a {decl.kind}, not a function")
            else:
                self.error(
                    e.func.span,
                    f"unknown function '{fname}'",
                    *_did_you_mean(fname, list(FUNCTIONS)),
                )
            return _Build.of(_bad, *e.args)  # the arguments are still checked
        if len(e.args) != row.arity:
            plural = "argument" if row.arity == 1 else "arguments"
            self.error(e.span, f"{fname}() takes {row.arity} {plural}, got {len(e.args)}")
            # where's condition is no second error
            operands = [(a, fname == "where" and i == 0) for i, a in enumerate(e.args)]
            return _Build(len(operands), _bad, operands)
        if fname == "where":
            cond = e.args[0]
            if not isinstance(cond, ast.Compare):
                self.error(
                    cond.span,
                    "the first argument of where() must be a comparison",
                    "for example: where(n == 0, a, b)",
                )
                return _Build.of(_bad, *e.args)  # still check them and mark their names used
            operands = [(cond, True), (e.args[1], False), (e.args[2], False)]
            return _Build(3, lambda a: Node(row.name, a, span=e.span), operands)
        return _Build.of(lambda a: Node(row.name, a, span=e.span), *e.args)

    # ---- result --------------------------------------------------------------------------
    def build(self) -> Cell:
        names = [s.name for s in self.states]
        roots = canonicalize([self.env[s] for s in names])
        if self.outputs is not None:
            outputs = self.outputs
        else:
            outputs = (self.recurrent[0],) if self.recurrent else (names[0],)
        return Cell(
            name=self.cell.name.name,
            states=tuple(self.states),
            projections=tuple(self.projections),
            params=tuple(self.params),
            consts=tuple(self.consts),
            recurrent=self.recurrent[0] if self.recurrent else None,
            updates=tuple(zip(names, roots, strict=True)),
            outputs=outputs,
            source=self.source,
        )


_BAD = Node("const", (), 0.0)  # stands in for an expression with an error


def _bad(operands: tuple[Node, ...]) -> Node:
    return _BAD


@dataclass(frozen=True)
class _Build:
    """Work of ``_CellLowering.expr``: build a node from the last ``arity`` lowered operands,
    after lowering ``operands`` (each with whether a comparison is allowed there)."""

    arity: int
    build: Callable[[tuple[Node, ...]], Node]
    operands: list[tuple[ast.Expr, bool]]

    @staticmethod
    def of(build: Callable[[tuple[Node, ...]], Node], *operands: ast.Expr) -> _Build:
        return _Build(len(operands), build, [(o, False) for o in operands])


def _term_text(term: ast.Term) -> str:
    return " ".join(w.name for w in term.words)


def lower(module: ast.Module, source: Source) -> tuple[list[Cell], list[Diagnostic]]:
    """Check and lower every cell of ``module``; see the module docstring.

    Returns the cells and the warnings; raises ``DslError`` with all errors and warnings of
    the file when any cell has an error.
    """
    cells: list[Cell] = []
    diags: list[Diagnostic] = []
    seen: dict[str, Span] = {}
    for cell_def in module.cells:
        first = seen.get(cell_def.name.name)
        if first is not None:
            diags.append(
                Diagnostic(
                    "error",
                    f"cell '{cell_def.name.name}' is defined twice",
                    cell_def.name.span,
                    source,
                    (f"first defined at {source.path}:{first.line}:{first.col}",),
                )
            )
        seen.setdefault(cell_def.name.name, cell_def.name.span)
        lowering = _CellLowering(cell_def, source)
        cell = lowering.run()
        diags.extend(lowering.diags)
        if cell is not None:
            cells.append(cell)
    if not module.cells:
        diags.append(
            Diagnostic(
                "error",
                "no cell in this file",
                Span(1, 1, 1, 2),  # file:1:1, so that every error names a line and column
                source,
                ("write: cell name(h) { ... }",),
            )
        )
    diags.sort(key=lambda d: (d.span.line, d.span.col) if d.span else (0, 0))
    if any(d.severity == "error" for d in diags):
        raise DslError(diags)
    return cells, diags


def leaves_of(cell: Cell) -> list[Node]:
    """Every leaf node the cell's updates reach (for tests and analyses)."""
    return [n for n in toposort([n for _, n in cell.updates]) if n.is_leaf]
