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

from rnncc.codegen.expr import render_body
from rnncc.codegen.stepwise import (
    GeneratedSource,
    LeafSpelling,
    header_comment,
    leaf_loads,
    leaf_name,
    update_lines,
    used_leaves,
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


def backward_lines(bwd: BackwardCell) -> list[str]:
    """The backward cell on one element: leaf loads, the body, then ``nd`` (cotangents of
    the old states), ``dWx``, the gate cotangents (shared memory for Rᵀ·dg and the per-step
    buffers for dR and db) and the params' cotangents."""
    cell = bwd.forward
    roots = list(bwd.roots)
    body = render_body(roots, leaf_name)
    used = used_leaves(roots)
    lines = ["// leaves", *leaf_loads(cell, used, FUSED_BACKWARD_LEAVES)]
    for k, s in enumerate(cell.state_names):
        if ("dstate", s) in used:
            lines.append(f"const float dn_{s} = ds[{k}][q];")
    for o, s in enumerate(cell.outputs):
        if ("dout", s) in used:
            lines.append(f"const float do_{s} = rnncc::to_float(dy[{o} * yO]);")
    lines.append("// the backward cell")
    lines += body.lines
    keys = (
        [("state", s) for s, _ in bwd.d_states]
        + [("gate", g) for g, _ in bwd.d_gates]
        + [("param", p) for p, _ in bwd.d_params]
    )
    results = dict(zip(keys, body.results, strict=True))
    lines.append("// cotangents of the old states, the gates and the params")
    for k, s in enumerate(cell.state_names):
        lines.append(f"nd[{k}][q] = {results[('state', s)]};")
    ix, ir, ib = (cell.part_index(p) for p in ("x", "r", "b"))
    for gate in cell.gates:
        g = gate.name
        lines.append(f"const float d_{g} = {results[('gate', g)]};")
        if g in ix:
            lines.append(f"dWx[{ix[g]} * NHD] = rnncc::from_float<T>(d_{g});")
        if g in ir:
            lines.append(f"dgs[{ir[g]} * kD + d][b] = d_{g};")
            lines.append(f"a.dGr[row * kRows + {ir[g]} * kD + d] = d_{g};")
        if g in ib:
            lines.append(f"a.dGb[row * (kGb * kD) + {ib[g]} * kD + d] = d_{g};")
    for k, p in enumerate(cell.param_names):
        lines.append(f"a.dP[row * (kP * kD) + {k} * kD + d] = {results[('param', p)]};")
    return lines


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
    join = lambda names: ", ".join(names) or "none"  # noqa: E731
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
        cell=cell.name,
        S=len(cell.states),
        O=len(cell.outputs),
        Gx=len(cell.gx_names),
        Gr=len(cell.gr_names),
        Gb=len(cell.gb_names),
        P=len(cell.params),
        rec=rec,
        D=D,
        BC=BATCH_CHUNK,
        threads=threads,
        state_names=join(cell.state_names),
        output_names=join(cell.outputs),
        gx_names=join(cell.gx_names),
        gr_names=join(cell.gr_names),
        gb_names=join(cell.gb_names),
        param_names=join(cell.param_names),
        update=update_lines(cell, FUSED_LEAVES),
        stores=stores,
        backward=backward_lines(bwd),
    )
    return GeneratedSource(f"{cell.name}_fused_d{D}.cu", text)
