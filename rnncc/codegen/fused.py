"""Cell IR → the CUDA source of the fused persistent kernels, block tier.

Input: a forward ``Cell`` and the head dim ``D``. Output: ``GeneratedSource`` for
``<cell>_fused_d<D>.cu`` (``templates/fused_block.cu.j2``): one thread block per (head, chunk of
``BATCH_CHUNK`` batch rows) runs the whole sequence with R, the states, the biases and the
params on chip; blocks never wait on each other. Two products, picked by the storage dtype:

- float32: FFMA, one row of R per thread as float (fp32-accurate), ``fused_ffma.cuh.j2``;
- bf16 / fp16: tensor cores (``mma.sync`` m16n8k16, fp32 accumulators), R as mma fragments
  in registers, one warp per 8 units, the cell run on the accumulators, ``fused_mma.cuh.j2``.

``fused_support`` says, per dtype, whether ``D`` fits; everything else runs stepwise. The
batch size stays a runtime value: the grid masks the last chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

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
#: The storage dtypes of the fused kernels, as torch spells them.
FUSED_DTYPES = ("float32", "float16", "bfloat16")
#: The FFMA kernels keep one row of R per thread in registers, as float.
MAX_FFMA_HEAD_DIM = 64
#: The tensor-core kernels keep R as mma fragments: at most this many registers per thread.
MMA_FRAGMENT_REGISTERS = 32
_SMEM_BYTES = 48 * 1024

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


FFMA_BACKWARD = BackwardSpelling(
    leaves=FFMA_BACKWARD_LEAVES,
    dstate="ds[{k}][q]",
    d_state="nd[{k}][q] = {v};",
    d_rh=("dgs[{k} * kD + d][b] = {v};", "a.dGr[row * kRows + {k} * kD + d] = {v};"),
    d_bias="a.dGb[row * (kGb * kD) + {k} * kD + d] = {v};",
    d_param="a.dP[row * (kP * kD) + {k} * kD + d] = {v};",
)


MMA_LEAVES = LeafSpelling(
    state="st[{k}][q]",
    wx="rnncc::to_float(wxv[{k}][q])",
    rh="acc[{k} / 2][{k} % 2 * 2 + q]",
    bias="bv[{k}][q]",
    param="pv[{k}][q]",
)


#: The tensor-core backward reads its per-step inputs from registers, prefetched two steps
#: ahead, and collects its results in registers, stored after both elements of a lane are done
#: (as pairs: the two are adjacent units).
MMA_BACKWARD = BackwardSpelling(
    leaves=LeafSpelling(
        state="cur.s[{k}][q]",
        wx="rnncc::to_float(cur.wx[{k}][q])",
        rh="cur.rh[{k}][q]",
        bias="bsm[{k}][d]",
        param="psm[{k}][d]",
    ),
    dstate="ds[{k}][q]",
    d_state="nd[{k}][q] = {v};",
    d_rh=("o.gr[{k}][q] = {v};",),
    d_bias="o.gb[{k}][q] = {v};",
    d_param="o.p[{k}][q] = {v};",
    dout="rnncc::to_float(cur.dy[{k}][q])",
    d_wx="o.wx[{k}][q] = {v};",
)


@dataclass(frozen=True)
class KernelLines:
    """The generated lines one pair of kernels (forward, backward) splices in."""

    update: list[str]
    stores: list[str]
    backward: list[str]
    threads: int


def threads_for(cell: Cell, D: int) -> int:
    """FFMA kernels: one thread per row of the head's R, at least 128, whole warps."""
    rows = len(cell.gr_names) * D
    return max(128, -(-rows // 32) * 32)


def mma_warps(D: int) -> int:
    """Tensor-core kernels: one warp per 8 units."""
    return -(-D // 8)


def mma_fragment_registers(cell: Cell, D: int) -> int:
    """Registers per thread that R takes as mma fragments: the forward's A (gate pairs × k
    tiles × 4) or the backward's B (gate rows / 16 × 2), whichever is larger."""
    gr, k_tiles = len(cell.gr_names), -(-D // 16)
    return max(-(-gr // 2) * k_tiles * 4, gr * k_tiles * 2)


def _ffma_support(cell: Cell, D: int) -> str | None:
    rows = len(cell.gr_names) * D
    if D > MAX_FFMA_HEAD_DIM:
        return f"head dim {D} > {MAX_FFMA_HEAD_DIM}: R rows no longer fit one thread's registers"
    if rows > 1024:
        return f"{rows} rows of R exceed the 1024 threads of a block"
    if (D * BATCH_CHUNK + BATCH_CHUNK * max(rows, 1)) * 4 > _SMEM_BYTES:
        return "h and R·h do not fit 48 KiB of shared memory"
    groups = threads_for(cell, D) // D if rows else 1
    if (D * BATCH_CHUNK * groups + BATCH_CHUNK * max(rows, 1)) * 4 > _SMEM_BYTES:
        return "dg and the backward's Rᵀ·dg partial sums do not fit 48 KiB of shared memory"
    return None


def _mma_support(cell: Cell, D: int) -> str | None:
    warps, regs = mma_warps(D), mma_fragment_registers(cell, D)
    if warps > 32:
        return f"head dim {D} needs {warps} warps of 8 units; a block has at most 32"
    if regs > MMA_FRAGMENT_REGISTERS:
        return (
            f"head dim {D}: R as mma fragments needs {regs} registers per thread "
            f"(> {MMA_FRAGMENT_REGISTERS})"
        )
    return None


def fused_support(cell: Cell, D: int, dtype: str = "bfloat16") -> str | None:
    """None when the block-tier kernel handles head dim ``D`` for storage ``dtype``
    (``"float32"``, ``"float16"`` or ``"bfloat16"``); else the reason it does not. float32
    runs the FFMA kernels, whose product is fp32-accurate (their limits are also the kernels'
    static_asserts); the 16-bit dtypes run the tensor-core kernels, whose register budget for
    R's fragments (``MMA_FRAGMENT_REGISTERS``) keeps them free of spills, as the nvcc test
    checks."""
    if dtype == "float32":
        reason = _ffma_support(cell, D)
        return None if reason is None else f"float32 (FFMA product): {reason}"
    if dtype in ("float16", "bfloat16"):
        reason = _mma_support(cell, D)
        return None if reason is None else f"{dtype} (tensor-core product): {reason}"
    raise ValueError(f"fused kernels store float32, float16 or bfloat16; got {dtype!r}")


def _stores(cell: Cell, y: str, h: str, h_type: str) -> list[str]:
    """A step's stores: the states into registers, the outputs into ``y`` (a format string
    over ``{o}``), the states into the saved history, the recurrent state into ``h`` (shared
    memory, of type ``h_type``)."""
    lines = [f"st[{k}][q] = new_{s};" for k, s in enumerate(cell.state_names)]
    for o, s in enumerate(cell.outputs):
        lines.append(f"{y.format(o=o)} = rnncc::from_float<T>(new_{s});")
    for k, s in enumerate(cell.state_names):
        lines.append(
            f"if (a.hist) a.hist[((((long long)(t + 1) * kS + {k}) * a.NH + n) * a.B + gb) * kD"
            f" + d] = new_{s};"
        )
    if cell.recurrent:
        lines.append(f"{h} = rnncc::from_float<{h_type}>(new_{cell.recurrent});")
    return lines


def generate_fused(cell: Cell, bwd: BackwardCell, D: int) -> GeneratedSource:
    """The block-tier fused forward and backward of ``cell`` for head dim ``D``: the FFMA
    kernels (float32) and the tensor-core kernels (bf16, fp16), each where it supports ``D``."""
    ffma = _ffma_support(cell, D) is None
    mma = _mma_support(cell, D) is None
    if not (ffma or mma):
        raise ValueError(f"no block-tier fused kernel for head dim {D}")
    rec = cell.state_names.index(cell.recurrent) if cell.recurrent else 0
    y_at = "(((long long){o} * a.B + gb) * a.T + t) * NHD + (long long)n * kD + d"
    plan = [f"fused block tier: one block per (head, {BATCH_CHUNK} batch rows)"]
    context: dict[str, object] = {"ffma": None, "mma": None}
    if ffma:
        threads = threads_for(cell, D)
        plan.append(f"float32: FFMA, {threads} threads")
        context["ffma"] = KernelLines(
            update=update_lines(cell, FFMA_LEAVES),
            stores=_stores(cell, "static_cast<T*>(a.y)[" + y_at + "]", "hs[d][b]", "float"),
            backward=backward_lines(bwd, FFMA_BACKWARD),
            threads=threads,
        )
    if mma:
        plan.append(f"bf16/fp16: mma.sync m16n8k16, {32 * mma_warps(D)} threads")
        context["mma"] = KernelLines(
            update=update_lines(cell, MMA_LEAVES),
            stores=_stores(
                cell, "Y[y0[q] + (long long)t * NHD + {o} * yO]", "hsm[(t + 1) & 1][b][d]", "T"
            ),
            backward=backward_lines(bwd, MMA_BACKWARD),
            threads=32 * mma_warps(D),
        )
    text = render_template(
        "fused_block.cu.j2",
        header=header_comment(cell, "; ".join(plan)),
        rec=rec,
        D=D,
        BC=BATCH_CHUNK,
        **context,
        **cell_context(cell),
    )
    return GeneratedSource(f"{cell.name}_fused_d{D}.cu", text)
