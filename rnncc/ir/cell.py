"""Declarations of the cell IR: a forward cell and the backward cell derived from it.

A ``Cell`` is the checked, lowered form of one ``cell`` block: its states (with initial
values), projection statements (which gates take ``W x``, ``R h``, ``b``), params, named
constants, the recurrent state (the one ``R`` multiplies, or None), one update expression
per state (the new value, as a ``Node`` DAG over the leaves ``state``, ``gate``, ``param``,
``const``) and the output states. Statement order and temporaries are gone: they live on as
DAG sharing and name hints.

A ``BackwardCell`` is one step of the reverse pass: from the old states, the gates, the
params and the cotangents of the new states (``dstate``) and of the per-step outputs
(``dout``) it computes the cotangents of the old states (excluding the path through ``R``,
which the kernels add as Rᵀ·dg), of every gate (equal to the cotangent of each of its
parts) and of the params (per element; the backends reduce them over batch and time).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from rnncc.errors import Source
from rnncc.ir.node import Node

PARTS = ("x", "r", "b")  # W x, R h, b: the terms a projection may sum


@dataclass(frozen=True)
class State:
    name: str
    init: float = 0.0


@dataclass(frozen=True)
class Gate:
    """A per-unit value from a projection: the sum of its ``parts`` (a subset of PARTS)."""

    name: str
    parts: tuple[str, ...]


@dataclass(frozen=True)
class Projection:
    """One projection statement as written: ``keyword gates... = terms...``."""

    keyword: str  # gates | input | recurrent
    gates: tuple[str, ...]
    terms: tuple[str, ...]  # parts in source order


@dataclass(frozen=True)
class Param:
    name: str
    init: float = 0.0


@dataclass(frozen=True)
class Const:
    name: str
    value: float


@dataclass(frozen=True)
class Cell:
    """One forward cell; see the module docstring."""

    name: str
    states: tuple[State, ...]
    projections: tuple[Projection, ...]
    params: tuple[Param, ...]
    consts: tuple[Const, ...]
    recurrent: str | None
    updates: tuple[tuple[str, Node], ...]
    outputs: tuple[str, ...]
    source: Source | None = field(default=None, compare=False, repr=False)

    # The derived names are cached (the cell is frozen): the call path reads them every call.
    @cached_property
    def gates(self) -> tuple[Gate, ...]:
        """All gates in source order."""
        return tuple(
            Gate(g, tuple(p for p in PARTS if p in proj.terms))
            for proj in self.projections
            for g in proj.gates
        )

    def _gates_with(self, part: str) -> tuple[str, ...]:
        return tuple(g.name for g in self.gates if part in g.parts)

    @cached_property
    def gx_names(self) -> tuple[str, ...]:
        """Gates with a ``W x`` term: the order of ``Wx``'s gate axis."""
        return self._gates_with("x")

    @cached_property
    def gr_names(self) -> tuple[str, ...]:
        """Gates with an ``R h`` term: the order of ``R``'s first axis."""
        return self._gates_with("r")

    @cached_property
    def gb_names(self) -> tuple[str, ...]:
        """Gates with a ``b`` term: the order of ``b``'s first axis."""
        return self._gates_with("b")

    def part_index(self, part: str) -> dict[str, int]:
        """Gate name → its index on the axis of ``part`` (``x``: Wx, ``r``: R, ``b``: b)."""
        return {g: k for k, g in enumerate(self._gates_with(part))}

    @cached_property
    def state_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.states)

    @cached_property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def update(self, state: str) -> Node:
        return dict(self.updates)[state]


@dataclass(frozen=True)
class BackwardCell:
    """One reverse step of ``forward``; see the module docstring. Every tuple is ordered
    like the corresponding declarations of the forward cell."""

    forward: Cell = field(compare=False, repr=False)
    d_states: tuple[tuple[str, Node], ...]
    d_gates: tuple[tuple[str, Node], ...]
    d_params: tuple[tuple[str, Node], ...]

    @property
    def roots(self) -> tuple[Node, ...]:
        return tuple(n for _, n in self.d_states + self.d_gates + self.d_params)
