"""Cell IR → the CUDA source of a fused variant's library (``templates/fused_block.cu.j2``).

The helpers the fused variants (``rnncc.variants``) call: how each kernel spells the cell's
leaves and stores (``LeafSpelling``s over the template's own registers and buffers), the
generated lines of each kernel pair (``ffma_lines``, ``mma_lines``, ``grid_lines``) and
``render_fused``, which renders one variant's kernels with the constants the variant takes
from its build record as the traits block. No rule about which sizes a kernel runs, and no
variant's constants, live here: the variants say those.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from rnncc.codegen.stepwise import (
    BackwardSpelling,
    GeneratedSource,
    LeafSpelling,
    backward_lines,
    cell_context,
    header_comment,
    tidy,
    update_lines,
)
from rnncc.codegen.templates import render_template
from rnncc.ir.cell import BackwardCell, Cell

FFMA_LEAVES = LeafSpelling(
    state="st[{k}][q]",
    wx="wxv[{k}][q]",
    rh="rhs[b][{k} * kD + d]",
    bias="bv[{k}][q]",
    param="pv[{k}][q]",
)


#: The backward reads the old states from the saved history and the gates' R·h from the
#: saved products, both in global memory.
FFMA_BACKWARD_LEAVES = LeafSpelling(
    state="a.hist[((((long long)t * kS + {k}) * a.NH + n) * a.B + gb) * kD + d]",
    wx="rnncc::to_float(Wx[{k} * NHD])",
    rh="a.rh[row * kRows + {k} * kD + d]",
    bias="bv[{k}][q]",
    param="pv[{k}][q]",
)


#: The gate cotangents go to shared memory (the product's operand) and, in the storage type,
#: to the head-major dGr of the host's dR GEMM; bias and param cotangents are summed over
#: time in registers (each thread keeps its elements for the whole sequence).
FFMA_BACKWARD = BackwardSpelling(
    leaves=FFMA_BACKWARD_LEAVES,
    dstate="ds[{k}][q]",
    d_state="nd[{k}][q] = {v};",
    d_rh=(
        "dgs[{k} * kD + d][b] = {v};",
        "static_cast<T*>(a.dGr)[grow * kRows + {k} * kD + d] = rnncc::from_float<T>({v});",
    ),
    d_bias="gbacc[{k}][q] += {v};",
    d_param="pacc[{k}][q] += {v};",
)


MMA_LEAVES = LeafSpelling(
    state="st[{k}][q]",
    wx="bits_float<T>(wxv[{k}][q])",
    rh="acc[{pair}][{half} + q]",
    bias="bv[{k}][q]",
    param="pv[{k}][q]",
)


#: The tensor-core backward reads its per-step inputs from registers (``cur``: read from the
#: shared-memory ring in the block tier, loaded a step ahead in the grid tier) and collects its
#: results in registers, stored after both elements of a lane are done (as pairs: the two are
#: adjacent units).
MMA_BACKWARD = BackwardSpelling(
    leaves=LeafSpelling(
        state="cur.s[{k}][q]",
        wx="raw_float<T>(cur.wx[{k}], q)",
        rh="cur.rh[{k}][q]",
        bias="bsm[{k}][d]",
        param="psm[{k}][d]",
    ),
    dstate="ds[{k}][q]",
    d_state="nd[{k}][q] = {v};",
    d_rh=("o.gr[{k}][q] = {v};",),
    d_bias="o.gb[{k}][q] = {v};",
    d_param="o.p[{k}][q] = {v};",
    dout="raw_float<T>(cur.dy[{k}], q)",
    d_wx="o.wx[{k}][q] = {v};",
)


#: The grid tier's backward: as the block tier's, but the biases and params in shared memory
#: hold only the block's units (from ``d_blk``).
GRID_BACKWARD = replace(
    MMA_BACKWARD,
    leaves=replace(MMA_BACKWARD.leaves, bias="bsm[{k}][d - d_blk]", param="psm[{k}][d - d_blk]"),
)


@dataclass(frozen=True)
class KernelLines:
    """The generated lines one pair of kernels (forward, backward) splices in."""

    update: list[str]
    stores: list[str]
    backward: list[str]
    #: Grid tier: the stores left for after the step's count (``_late_stores``).
    late: list[str] = field(default_factory=list)


#: The FFMA forward's saved states: the whole index, per element.
FFMA_HIST = "a.hist[((((long long)(t + 1) * kS + {k}) * a.NH + n) * a.B + gb) * kD + d]"
#: The tensor-core forwards spell a lane's output addresses (y, the saved states) as pointers
#: to the step's elements: the block tier moves them one step on per step rather than
#: computing whole 64-bit indices per store.
MMA_Y = "yp[q][{o} * yO]"
MMA_HIST = "hp[q][{k} * NBD]"


def _stores(cell: Cell, y: str, h: str, hist: str = FFMA_HIST) -> list[str]:
    """A step's stores: the states into registers, the outputs into ``y`` (a format string
    over ``{o}``), the states into the saved history ``hist`` (over ``{k}``), the recurrent
    state through ``h`` (a statement over ``{v}``: into shared memory, or published to the
    other blocks)."""
    lines = _to_registers(cell) + _outputs(cell, y, hist, "new_{s}")
    if cell.recurrent:
        lines.append(h.format(v=f"new_{cell.recurrent}"))
    return lines


def _to_registers(cell: Cell) -> list[str]:
    """The step's new states into the lanes' state registers."""
    return [f"st[{k}][q] = new_{s};" for k, s in enumerate(cell.state_names)]


def _outputs(cell: Cell, y: str, hist: str, value: str) -> list[str]:
    """The outputs into ``y`` and the states into the saved history ``hist`` (format strings
    as ``_stores``'), each state's value spelled by ``value`` (over ``{k}`` and ``{s}``)."""
    index = {s: k for k, s in enumerate(cell.state_names)}
    lines = [
        f"{y.format(o=o)} = rnncc::from_float<T>({value.format(k=index[s], s=s)});"
        for o, s in enumerate(cell.outputs)
    ]
    lines += [
        f"if (a.hist) {hist.format(k=k)} = {value.format(k=k, s=s)};" for s, k in index.items()
    ]
    return lines


def _late_stores(cell: Cell, y: str, hist: str) -> list[str]:
    """The grid forward's outputs and saved states, stored from the states' registers after
    the step's h is published and counted: the count's release waits for every store the
    warp issued before it, and these are needed only after the kernel."""
    return _outputs(cell, y, hist, "st[{k}][q]")


_Y_AT = "(((long long){o} * a.B + gb) * a.T + t) * NHD + (long long)n * kD + d"


def ffma_lines(cell: Cell, bwd: BackwardCell) -> KernelLines:
    """The FFMA kernels' cell lines."""
    return KernelLines(
        update=tidy(update_lines(cell, FFMA_LEAVES)),
        stores=tidy(
            _stores(
                cell,
                "static_cast<T*>(a.y)[" + _Y_AT + "]",
                "hs[d][b] = rnncc::from_float<float>({v});",
            )
        ),
        backward=tidy(backward_lines(bwd, FFMA_BACKWARD)),
    )


def mma_lines(cell: Cell, bwd: BackwardCell) -> KernelLines:
    """The block tier's tensor-core kernels' cell lines."""
    return KernelLines(
        update=tidy(update_lines(cell, MMA_LEAVES)),
        stores=tidy(
            _stores(cell, MMA_Y, "hsm[(t + 1) & 1][b][d] = rnncc::from_float<T>({v});", MMA_HIST)
        ),
        backward=tidy(backward_lines(bwd, MMA_BACKWARD)),
    )


def grid_lines(cell: Cell, bwd: BackwardCell) -> KernelLines:
    """The grid tier's cell lines: h published to the other blocks, the outputs stored late."""
    publish = (
        "rnncc::xchg_put(ex.slot(t + 1) + xchg_at(gb, rnncc::frag_pos(d)), "
        "rnncc::from_float<T>({v}));"
    )
    h = [publish.format(v=f"new_{cell.recurrent}")] if cell.recurrent else []
    return KernelLines(
        update=tidy(update_lines(cell, MMA_LEAVES)),
        stores=tidy(_to_registers(cell) + h),
        backward=tidy(backward_lines(bwd, GRID_BACKWARD)),
        late=tidy(_late_stores(cell, MMA_Y, MMA_HIST)),
    )


#: A compile-time constant of the traits block: (C++ type, name, value).
Trait = tuple[str, str, Any]


def render_fused(
    cell: Cell,
    variant: str,
    build: Mapping[str, Any],
    traits: list[Trait],
    *,
    ffma: KernelLines | None = None,
    mma: KernelLines | None = None,
    grid: KernelLines | None = None,
) -> GeneratedSource:
    """The library of one fused variant (``block_ffma``, ``block_mma`` or ``grid_mma``) for
    ``cell``: ``traits`` (the variant's constants from its build record) become the traits
    block, ``build`` goes into the header as the plan."""
    D = build["D"]
    plan = f"{variant}, " + json.dumps(build, sort_keys=True)
    text = render_template(
        "fused_block.cu.j2",
        header=header_comment(cell, plan),
        rec=cell.state_names.index(cell.recurrent) if cell.recurrent else 0,
        D=D,
        BC=build["batch_chunk"],
        traits=traits,
        ffma=ffma,
        mma=mma,
        grid=grid,
        **cell_context(cell),
    )
    return GeneratedSource(f"{cell.name}_{variant}_d{D}.cu", text)
