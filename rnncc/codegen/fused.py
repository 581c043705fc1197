"""Cell IR → the CUDA source of the fused persistent forward kernel, block tier.

Input: a forward ``Cell`` and the head dim ``D``. Output: ``GeneratedSource`` for
``<cell>_fused_d<D>.cu`` (``templates/fused_block.cu.j2``). The kernel keeps one row of R per
thread in registers and a block's states, biases and params in registers for the whole
sequence (``W x`` of a step is loaded before that step's R·h, to hide its latency), so it exists
for head dims whose R fits one block (``fused_support``); everything else runs stepwise.
The batch size stays a runtime value: the grid has one block per (head, chunk of ``BC``
rows) and masks the last chunk.
"""

from __future__ import annotations

from rnncc.codegen.stepwise import (
    BackwardSpelling,
    GeneratedSource,
    LeafSpelling,
    backward_lines,
    cell_context,
    header_comment,
    update_lines,
)
from rnncc.codegen.templates import render_template
from rnncc.ir.cell import BackwardCell, Cell

BATCH_CHUNK = 8
MAX_HEAD_DIM = 64
_SMEM_BYTES = 48 * 1024

FUSED_LEAVES = LeafSpelling(
    state="st[{k}][q]",
    wx="wxv[{k}][q]",
    rh="rhs[b][{k} * kD + d]",
    bias="bv[{k}][q]",
    param="pv[{k}][q]",
)


#: The backward reads the old states from the saved history and the gates' R·h from the
#: saved products, both in global memory.
FUSED_BACKWARD_LEAVES = LeafSpelling(
    state="a.hist[((((long long)t * kS + {k}) * a.NH + n) * a.B + gb) * kD + d]",
    wx="rnncc::to_float(Wx[{k} * NHD])",
    rh="a.rh[row * kRows + {k} * kD + d]",
    bias="bv[{k}][q]",
    param="pv[{k}][q]",
)


FUSED_BACKWARD = BackwardSpelling(
    leaves=FUSED_BACKWARD_LEAVES,
    dstate="ds[{k}][q]",
    d_state="nd[{k}][q] = {v};",
    d_rh=("dgs[{k} * kD + d][b] = {v};", "a.dGr[row * kRows + {k} * kD + d] = {v};"),
    d_bias="a.dGb[row * (kGb * kD) + {k} * kD + d] = {v};",
    d_param="a.dP[row * (kP * kD) + {k} * kD + d] = {v};",
)


def threads_for(cell: Cell, D: int) -> int:
    """One thread per row of the head's R, at least 128, whole warps."""
    rows = len(cell.gr_names) * D
    return max(128, -(-rows // 32) * 32)


def fused_support(cell: Cell, D: int) -> str | None:
    """None when the block-tier kernel handles head dim ``D``; else the reason it does not
    (the same limits the kernel states as static_asserts)."""
    rows = len(cell.gr_names) * D
    if D > MAX_HEAD_DIM:
        return f"head dim {D} > {MAX_HEAD_DIM}: R rows no longer fit one thread's registers"
    if rows > 1024:
        return f"{rows} rows of R exceed the 1024 threads of a block"
    if (D * BATCH_CHUNK + BATCH_CHUNK * max(rows, 1)) * 4 > _SMEM_BYTES:
        return "h and R·h do not fit 48 KiB of shared memory"
    groups = threads_for(cell, D) // D if rows else 1
    if (D * BATCH_CHUNK * groups + BATCH_CHUNK * max(rows, 1)) * 4 > _SMEM_BYTES:
        return "dg and the backward's Rᵀ·dg partial sums do not fit 48 KiB of shared memory"
    return None


def generate_fused(cell: Cell, bwd: BackwardCell, D: int) -> GeneratedSource:
    """The block-tier fused forward and backward of ``cell`` for head dim ``D``."""
    rec = cell.state_names.index(cell.recurrent) if cell.recurrent else 0
    stores = [f"st[{k}][q] = new_{s};" for k, s in enumerate(cell.state_names)]
    for o, s in enumerate(cell.outputs):
        stores.append(
            f"static_cast<T*>(a.y)[(((long long){o} * a.B + gb) * a.T + t) * NHD + "
            f"(long long)n * kD + d] = rnncc::from_float<T>(new_{s});"
        )
    for k, s in enumerate(cell.state_names):
        stores.append(
            f"if (a.hist) a.hist[((((long long)(t + 1) * kS + {k}) * a.NH + n) * a.B + gb) * kD"
            f" + d] = new_{s};"
        )
    if cell.recurrent:
        stores.append(f"hs[d][b] = new_{cell.recurrent};")
    threads = threads_for(cell, D)
    plan = f"fused block tier: one block per (head, {BATCH_CHUNK} batch rows), {threads} threads"
    text = render_template(
        "fused_block.cu.j2",
        header=header_comment(cell, plan),
        rec=rec,
        D=D,
        BC=BATCH_CHUNK,
        threads=threads,
        update=update_lines(cell, FUSED_LEAVES),
        stores=stores,
        backward=backward_lines(bwd, FUSED_BACKWARD),
        **cell_context(cell),
    )
    return GeneratedSource(f"{cell.name}_fused_d{D}.cu", text)
