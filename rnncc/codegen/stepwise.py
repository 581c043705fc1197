"""Cell IR → the CUDA source of the stepwise backend's per-step kernels.

Input: a forward ``Cell`` and its ``BackwardCell``. Output: ``GeneratedSource`` — the text of
``<cell>_stepwise.cu`` (rendered from ``templates/stepwise_cell.cu.j2``) plus the names of the
headers it includes. The kernel bodies are built here, in Python, as lines of C: leaf loads
(only the leaves a body reads), the rendered expressions, and the stores; the template only
places them. Identifiers: ``s_<state>`` old states, ``g_<gate>`` gates, ``p_<param>``
params, ``dn_<state>``/``do_<state>`` the cotangents of new states and outputs, ``v_<name>``
temporaries, ``new_<state>`` / ``d_<name>`` results.

Deterministic: the same cells give byte-identical text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rnncc import __version__
from rnncc.codegen.escape import c_comment
from rnncc.codegen.expr import render_body
from rnncc.codegen.templates import render_template
from rnncc.ir.cell import BackwardCell, Cell
from rnncc.ir.node import Node, toposort

HEADERS = ("rnncc_abi.h", "rnncc_ops.cuh", "rnncc_mma.cuh")
_LEAF_PREFIX = {"state": "s_", "gate": "g_", "param": "p_", "dstate": "dn_", "dout": "do_"}


@dataclass(frozen=True)
class GeneratedSource:
    filename: str
    text: str
    headers: tuple[str, ...] = HEADERS


#: Index arithmetic that the spellings write for a leaf's index k and that reads as noise once
#: k is a number: ``[0 * NBD + i]`` is ``[i]``, ``[0 * yO]`` is ``[0]``, ``[0 + q]`` is
#: ``[q]``, ``1 * NHD`` is ``NHD``. Rendered expressions never hold a bare integer (their
#: literals are ``1.0f``), so only the spellings' indices match.
_NOISE = (
    (re.compile(r"\[0 \* [\w.]+ \+ "), "["),
    (re.compile(r"\[0 \* [\w.]+\]"), "[0]"),
    (re.compile(r"\[0 \+ "), "["),
    (re.compile(r"(?<![\w.])1 \* ([\w.]+)"), r"\1"),
)


def tidy(lines: list[str]) -> list[str]:
    """``lines`` without the index arithmetic of ``_NOISE``."""
    out = []
    for line in lines:
        for pattern, repl in _NOISE:
            line = pattern.sub(repl, line)
        out.append(line)
    return out


def leaf_name(node: Node) -> str:
    return _LEAF_PREFIX[node.op] + str(node.arg)


def used_leaves(roots: list[Node]) -> set[tuple[str, str]]:
    return {(n.op, n.arg) for n in toposort(roots) if n.is_leaf and n.op != "const"}


@dataclass(frozen=True)
class LeafSpelling:
    """How a kernel reads each kind of leaf: format strings over ``{k}``, the leaf's index on
    its axis (state, param, or gate index within ``W x`` / ``R h`` / ``b``); ``rh`` may also
    use ``{pair}`` and ``{half}``, k // 2 and k % 2 * 2 (where a gate pair's accumulators hold
    the gate)."""

    state: str
    wx: str
    rh: str
    bias: str
    param: str


#: The stepwise kernels: one thread per element, states in global memory.
STEPWISE_LEAVES = LeafSpelling(
    state="a.s_old[{k} * NBD + i]",
    wx="rnncc::to_float(Wx[{k} * NHD])",
    rh="Rh[{k} * a.D]",
    bias="rnncc::to_float(bias[{k} * NHD])",
    param="rnncc::to_float(prm[{k} * NHD])",
)


def leaf_loads(cell: Cell, used: set[tuple[str, str]], spell: LeafSpelling) -> list[str]:
    """Load lines for the leaves in ``used``, in declaration order."""
    ix, ir, ib = (cell.part_index(p) for p in ("x", "r", "b"))
    lines = []
    for k, s in enumerate(cell.state_names):
        if ("state", s) in used:
            lines.append(f"const float s_{s} = {spell.state.format(k=k)};")
    for gate in cell.gates:
        g = gate.name
        if ("gate", g) not in used:
            continue
        parts = []
        if g in ix:
            parts.append(spell.wx.format(k=ix[g]))
        if g in ir:
            k = ir[g]  # the mma accumulators hold gate pairs: pair k // 2, element k % 2 * 2
            parts.append(spell.rh.format(k=k, pair=k // 2, half=k % 2 * 2))
        if g in ib:
            parts.append(spell.bias.format(k=ib[g]))
        lines.append(f"const float g_{g} = {' + '.join(parts)};")
    for k, p in enumerate(cell.param_names):
        if ("param", p) in used:
            lines.append(f"const float p_{p} = {spell.param.format(k=k)};")
    return lines


def update_lines(cell: Cell, spell: LeafSpelling) -> list[str]:
    """Leaf loads, the cell, and ``const float new_<state> = ...;`` for every state."""
    roots = [n for _, n in cell.updates]
    body = render_body(roots, leaf_name, root_names=[f"new_{s}" for s, _ in cell.updates])
    lines = ["// leaves", *leaf_loads(cell, used_leaves(roots), spell), "// the cell"]
    lines += body.lines
    new = [(s, e) for (s, _), e in zip(cell.updates, body.results, strict=True) if e != f"new_{s}"]
    if new:
        lines.append("// new states")
    lines += [f"const float new_{s} = {expr};" for s, expr in new]
    return lines


def forward_lines(cell: Cell) -> list[str]:
    lines = update_lines(cell, STEPWISE_LEAVES)
    lines.append("// stores")
    for k, s in enumerate(cell.state_names):
        lines.append(f"a.s_new[{k} * NBD + i] = new_{s};")
    for o, s in enumerate(cell.outputs):
        lines.append(f"y[{o} * yO] = rnncc::from_float<T>(new_{s});")
    return lines


@dataclass(frozen=True)
class BackwardSpelling:
    """How a backward kernel reads the cotangents of the new states and of the outputs and
    writes its results: format strings over ``{k}`` (index on the axis) and ``{v}`` (the
    value)."""

    leaves: LeafSpelling
    dstate: str
    d_state: str
    d_rh: tuple[str, ...]
    d_bias: str
    d_param: str
    dout: str = "rnncc::to_float(dy[{k} * yO])"
    d_wx: str = "dWx[{k} * NHD] = rnncc::from_float<T>({v});"


STEPWISE_BACKWARD = BackwardSpelling(
    leaves=STEPWISE_LEAVES,
    dstate="a.ds_new[{k} * NBD + i]",
    d_state="a.ds_old[{k} * NBD + i] = {v};",
    d_rh=("dGr[{k} * a.D] = {v};",),
    d_bias="dGb[{k} * a.D] = {v};",
    d_param="dP[{k} * a.D] = {v};",
)


def backward_lines(bwd: BackwardCell, spell: BackwardSpelling = STEPWISE_BACKWARD) -> list[str]:
    """The backward cell on one element: leaf loads, the body, then the cotangents of the old
    states, ``dWx`` and the other gate parts' and the params' cotangents, as ``spell`` says."""
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
    lines = ["// leaves", *leaf_loads(cell, used, spell.leaves)]
    for k, s in enumerate(cell.state_names):
        if ("dstate", s) in used:
            lines.append(f"const float dn_{s} = {spell.dstate.format(k=k)};")
    for o, s in enumerate(cell.outputs):
        if ("dout", s) in used:
            lines.append(f"const float do_{s} = {spell.dout.format(k=o)};")
    lines.append("// the backward cell")
    lines += body.lines
    results = dict(zip(keys, body.results, strict=True))
    lines.append("// cotangents of the old states, the gates and the params")
    for k, s in enumerate(cell.state_names):
        lines.append(spell.d_state.format(k=k, v=results[("state", s)]))
    ix, ir, ib = (cell.part_index(p) for p in ("x", "r", "b"))
    for gate in cell.gates:
        g = gate.name
        if results[("gate", g)] != f"d_{g}":
            lines.append(f"const float d_{g} = {results[('gate', g)]};")
        if g in ix:
            lines.append(spell.d_wx.format(k=ix[g], v=f"d_{g}"))
        if g in ir:
            lines += [store.format(k=ir[g], v=f"d_{g}") for store in spell.d_rh]
        if g in ib:
            lines.append(spell.d_bias.format(k=ib[g], v=f"d_{g}"))
    for k, p in enumerate(cell.param_names):
        lines.append(spell.d_param.format(k=k, v=results[("param", p)]))
    return lines


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


def cell_context(cell: Cell) -> dict[str, object]:
    """The template variables that describe a cell's declarations: counts, and names for the
    comments (through ``c_comment``)."""
    join = lambda names: c_comment(", ".join(names) or "none")  # noqa: E731
    return {
        "cell": c_comment(cell.name),
        "S": len(cell.states),
        "O": len(cell.outputs),
        "Gx": len(cell.gx_names),
        "Gr": len(cell.gr_names),
        "Gb": len(cell.gb_names),
        "P": len(cell.params),
        "state_names": join(cell.state_names),
        "output_names": join(cell.outputs),
        "gx_names": join(cell.gx_names),
        "gr_names": join(cell.gr_names),
        "gb_names": join(cell.gb_names),
        "param_names": join(cell.param_names),
    }


def generate_stepwise(cell: Cell, bwd: BackwardCell, threads: int = 256) -> GeneratedSource:
    """The stepwise kernels of ``cell``, ``threads`` per block; see the module docstring."""
    text = render_template(
        "stepwise_cell.cu.j2",
        header=header_comment(
            cell, f"stepwise: one thread per (head, batch, unit), {threads} per block"
        ),
        threads=threads,
        forward=tidy(forward_lines(cell)),
        backward=tidy(backward_lines(bwd)),
        **cell_context(cell),
    )
    return GeneratedSource(f"{cell.name}_stepwise.cu", text)
