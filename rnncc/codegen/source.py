"""Cell IR → the CUDA source of one variant's kernel library (``templates/cell.cu.j2``).

The generated file holds what is particular to the cell and the plan: a struct ``Cell`` with
the cell's shape, the plan's compile-time constants (the variant's traits) and the two hooks
the kernels call per element, ``forward(in, next)`` and ``backward(in, out)``; then the
library's ``extern "C"`` entry points. The kernels themselves are the variant's hand-written
skeleton (``templates/<variant>.cuh``), templated on ``Cell``.

The hooks read the cell's leaves through ``in`` (``in.state(k)``, ``in.wx(k)``, ``in.rh(k)``,
``in.bias(k)``, ``in.param(k)``; backward also ``in.dstate(k)``, ``in.dout(o)``) and write
the backward's results through ``out`` (``out.d_state(k, v)``, ``out.d_wx``, ``out.d_rh``,
``out.d_bias``, ``out.d_param``): each skeleton says where those live. Identifiers in the
hooks: ``s_<state>`` old states, ``g_<gate>`` gates, ``p_<param>`` params,
``dn_<state>``/``do_<state>`` the cotangents of new states and outputs, ``v_<name>``
temporaries, ``new_<state>`` / ``d_<name>`` results: the user's names.

Deterministic: the same cell and plan give byte-identical text.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rnncc import __version__
from rnncc.codegen.escape import c_comment
from rnncc.codegen.expr import render_body
from rnncc.codegen.templates import read_template, render_template
from rnncc.ir.cell import BackwardCell, Cell
from rnncc.ir.node import Node, toposort

_LEAF_PREFIX = {"state": "s_", "gate": "g_", "param": "p_", "dstate": "dn_", "dout": "do_"}

_FAST_NAMESPACE = re.compile(r"namespace fast \{(.*?)\}  // namespace fast", re.S)
_HELPER = re.compile(r"__device__ __forceinline__ float (rnncc_\w+)\(")


@functools.cache
def fast_ops() -> tuple[str, ...]:
    """The helpers with a faster form for 16-bit storage: those ``rnncc_ops.cuh`` defines in
    ``rnncc::fast``."""
    match = _FAST_NAMESPACE.search(read_template("rnncc_ops.cuh"))
    if match is None:
        raise RuntimeError("templates/rnncc_ops.cuh defines no namespace fast")
    return tuple(sorted(set(_HELPER.findall(match.group(1)))))


_INCLUDE = re.compile(r'^#include "([^"]+)"', re.M)


@functools.cache
def skeleton_headers(name: str) -> tuple[str, ...]:
    """``name`` and every header it includes with ``#include "..."``, followed through the
    shipped templates: what a library's build copies beside its source and hashes."""
    seen: list[str] = []
    todo = [name]
    while todo:
        header = todo.pop()
        if header not in seen:
            seen.append(header)
            todo += _INCLUDE.findall(read_template(header))
    return tuple(sorted(seen))


@dataclass(frozen=True)
class GeneratedSource:
    filename: str
    text: str
    headers: tuple[str, ...] = ()


#: A compile-time constant of the traits: (C++ type, name, value).
Trait = tuple[str, str, Any]


def leaf_name(node: Node) -> str:
    return _LEAF_PREFIX[node.op] + str(node.arg)


def used_leaves(roots: list[Node]) -> set[tuple[str, str]]:
    return {(n.op, n.arg) for n in toposort(roots) if n.is_leaf and n.op != "const"}


def leaf_loads(cell: Cell, used: set[tuple[str, str]]) -> list[str]:
    """Load lines for the leaves in ``used``, in declaration order."""
    ix, ir, ib = (cell.part_index(p) for p in ("x", "r", "b"))
    lines = []
    for k, s in enumerate(cell.state_names):
        if ("state", s) in used:
            lines.append(f"const float s_{s} = in.state({k});")
    for gate in cell.gates:
        g = gate.name
        if ("gate", g) not in used:
            continue
        parts = []
        if g in ix:
            parts.append(f"in.wx({ix[g]})")
        if g in ir:
            parts.append(f"in.rh({ir[g]})")
        if g in ib:
            parts.append(f"in.bias({ib[g]})")
        lines.append(f"const float g_{g} = {' + '.join(parts)};")
    for k, p in enumerate(cell.param_names):
        if ("param", p) in used:
            lines.append(f"const float p_{p} = in.param({k});")
    return lines


def forward_lines(cell: Cell) -> list[str]:
    """The forward hook's body: leaf loads, the cell, ``next[k] = new_<state>;``."""
    roots = [n for _, n in cell.updates]
    body = render_body(roots, leaf_name, root_names=[f"new_{s}" for s, _ in cell.updates])
    lines = [*leaf_loads(cell, used_leaves(roots)), *body.lines]
    value = dict(zip((s for s, _ in cell.updates), body.results, strict=True))
    lines += [f"next[{k}] = {value[s]};" for k, s in enumerate(cell.state_names)]
    return lines


def backward_lines(bwd: BackwardCell) -> list[str]:
    """The backward hook's body: leaf loads, the backward cell, then the cotangents of the old
    states, of the gates' parts (``W x``, ``R h``, ``b``) and of the params, through ``out``."""
    cell = bwd.forward
    roots = list(bwd.roots)
    keys = (
        [("state", s) for s, _ in bwd.d_states]
        + [("gate", g) for g, _ in bwd.d_gates]
        + [("param", p) for p, _ in bwd.d_params]
    )
    names = [f"d_{name}" if kind == "gate" else None for kind, name in keys]
    body = render_body(roots, leaf_name, root_names=names)
    used = used_leaves(roots)
    lines = leaf_loads(cell, used)
    for k, s in enumerate(cell.state_names):
        if ("dstate", s) in used:
            lines.append(f"const float dn_{s} = in.dstate({k});")
    for o, s in enumerate(cell.outputs):
        if ("dout", s) in used:
            lines.append(f"const float do_{s} = in.dout({o});")
    lines += body.lines
    results = dict(zip(keys, body.results, strict=True))
    for k, s in enumerate(cell.state_names):
        lines.append(f"out.d_state({k}, {results[('state', s)]});")
    ix, ir, ib = (cell.part_index(p) for p in ("x", "r", "b"))
    for gate in cell.gates:
        g = gate.name
        if results[("gate", g)] != f"d_{g}":
            lines.append(f"const float d_{g} = {results[('gate', g)]};")
        for part, index in (("wx", ix), ("rh", ir), ("bias", ib)):
            if g in index:
                lines.append(f"out.d_{part}({index[g]}, d_{g});")
    for k, p in enumerate(cell.param_names):
        lines.append(f"out.d_param({k}, {results[('param', p)]});")
    return lines


def fast_math(lines: Sequence[str]) -> list[str]:
    """Using-declarations that give ``lines`` the fast forms of the helpers they call."""
    text = "\n".join(lines)
    return [f"using rnncc::fast::{op};" for op in fast_ops() if re.search(rf"\b{op}\(", text)]


def header_comment(cell: Cell, plan: str) -> str:
    """The generated file's header: rnncc version, the cell's source, the plan. The source is
    split into lines where the .rnn lexer splits it (at ``\\n``); each line and the file name
    go through ``c_comment``, so no character of them leaves the comment."""
    text = cell.source.text.rstrip("\n") if cell.source else ""
    source = [line.removesuffix("\r") for line in text.split("\n")] if text else []
    # The file name only: the text (and so the build cache key) must not depend on where the
    # .rnn file lives, whichever separator its path uses.
    path = re.split(r"[\\/]", cell.source.path)[-1] if cell.source else "<string>"
    lines = [
        f"// Generated by rnncc {__version__} from cell '{c_comment(cell.name)}' of "
        f"{c_comment(path)}. Do not edit.",
        f"// Plan: {c_comment(plan)}",
        "// Source:",
        *[f"//   {c_comment(line)}".rstrip() for line in source],
    ]
    return "\n".join(lines)


def _names(names: Sequence[str]) -> str:
    return c_comment(", ".join(names) or "none")


def shape(cell: Cell) -> list[tuple[str, int, str]]:
    """The cell's shape as the skeletons read it: (name, value, comment)."""
    rec = cell.state_names.index(cell.recurrent) if cell.recurrent else 0
    return [
        ("kS", len(cell.states), "states: " + _names(cell.state_names)),
        ("kO", len(cell.outputs), "outputs: " + _names(cell.outputs)),
        ("kGx", len(cell.gx_names), "W x gates: " + _names(cell.gx_names)),
        ("kGr", len(cell.gr_names), "R h gates: " + _names(cell.gr_names)),
        ("kGb", len(cell.gb_names), "b gates: " + _names(cell.gb_names)),
        ("kP", len(cell.params), "params: " + _names(cell.param_names)),
        ("kRec", rec, "the recurrent state: " + c_comment(cell.recurrent or "none")),
    ]


def render_cell(
    cell: Cell,
    bwd: BackwardCell,
    *,
    filename: str,
    plan: str,
    skeleton: str,
    traits: Sequence[Trait],
    fast: bool,
) -> GeneratedSource:
    """The library of one variant for ``cell``: the ``Cell`` struct (shape, ``traits``, the
    hooks; ``fast``: the 16-bit kernels' fast helpers) and the entry points of ``skeleton``
    (``templates/<variant>.cuh``); ``plan`` goes into the header."""
    index = {s: k for k, s in enumerate(cell.state_names)}
    forward, backward = forward_lines(cell), backward_lines(bwd)
    text = render_template(
        "cell.cu.j2",
        header=header_comment(cell, plan),
        cell=c_comment(cell.name),
        skeleton=skeleton,
        namespace="rnncc::" + skeleton.removesuffix(".cuh"),
        stepwise=skeleton == "stepwise.cuh",
        shape=shape(cell),
        traits=traits,
        output_state=" : ".join(f"o == {o} ? {index[s]}" for o, s in enumerate(cell.outputs))
        + " : -1",
        forward=(fast_math(forward) if fast else []) + forward,
        backward=(fast_math(backward) if fast else []) + backward,
    )
    return GeneratedSource(filename, text, skeleton_headers(skeleton))


def render_fused(
    cell: Cell,
    bwd: BackwardCell,
    variant: str,
    build: Mapping[str, Any],
    traits: Sequence[Trait],
    *,
    fast: bool,
) -> GeneratedSource:
    """A fused variant's library: its skeleton ``<variant>.cuh`` on ``traits`` and
    ``kTimeline`` (the build record's ``timeline``: per-row lengths and the reverse direction),
    the build record in the header as the plan, named ``<cell>_<variant>_d<D>[_<dtype>][_timeline].cu``
    (a dtype where the build is of one: ``fp32``)."""
    timeline = bool(build.get("timeline"))
    dtype = f"_{build['dtype']}" if "dtype" in build else ""
    return render_cell(
        cell,
        bwd,
        filename=f"{cell.name}_{variant}_d{build['D']}{dtype}{'_timeline' if timeline else ''}.cu",
        plan=f"{variant}, " + json.dumps(build, sort_keys=True),
        skeleton=f"{variant}.cuh",
        traits=[*traits, ("bool", "kTimeline", "true" if timeline else "false")],
        fast=fast,
    )
