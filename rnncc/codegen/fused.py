"""Cell IR → the CUDA source of the fused persistent kernels.

Input: a forward ``Cell`` and the head dim ``D``. Output: ``GeneratedSource`` for
``<cell>_fused_d<D>.cu`` (``templates/fused_block.cu.j2``): R, the states, the biases and the
params stay on chip for the whole sequence. Two tiers and two products:

- block tier: one thread block per (head, chunk of ``BATCH_CHUNK`` batch rows); blocks never
  wait on each other. float32 runs FFMA, one row of R per thread as float (fp32-accurate,
  ``fused_ffma.cuh.j2``); bf16 / fp16 run tensor cores (``mma.sync`` m16n8k16, fp32
  accumulators), R as mma fragments in registers, one warp per 8 units, the cell run on the
  accumulators (``fused_mma.cuh.j2``);
- grid tier (bf16 / fp16, heads too large for one SM, ``D <= MAX_GRID_HEAD_DIM``): a head's
  8-unit slices (or 16-unit ones, wide blocks: ``grid_wide``) on separate blocks of one
  cooperative launch, R's k split over a block's
  warps, h (forward) and dg (backward) exchanged through global memory as 16-bit values
  behind a counter per batch chunk, each block waiting only for the values it reads
  (``fused_grid.cuh.j2``).

``fused_support`` says, per dtype, whether ``D`` fits and ``fused_tier`` which tier runs it;
everything else runs stepwise. The batch size stays a runtime value: the last chunk is masked.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

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
#: The block tier's tensor-core kernels take at most this many warps (8 units each): past 16,
#: a thread's 64 registers no longer hold the cell without spills.
MMA_BLOCK_WARPS = 16
_SMEM_BYTES = 48 * 1024
#: The grid tier runs one block per 8 (or 16) units of a head, all resident at once: 128 blocks
#: fit the 132 SMs of an H100 or H200.
MAX_GRID_HEAD_DIM = 1024
#: Dynamic shared memory a grid-tier block may take (sm_90: 227 KiB).
_GRID_SMEM_BYTES = 227 * 1024

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
    rh="acc[{k} / 2][{k} % 2 * 2 + q]",
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
    threads: int
    #: Grid tier: the stores left for after the step's count (``_late_stores``).
    late: list[str] = field(default_factory=list)
    #: Grid tier: whether the wide blocks (16 units) are built besides the narrow ones (``grid_wide``).
    wide: bool = False


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


#: Block tier forward: steps of W x copied ahead into shared memory (kWxAhead), in a ring of
#: one more slot (fused_mma.cuh.j2).
MMA_WX_AHEAD = 3
#: Block tier backward: steps of its inputs (saved states, R·h, W x, dy) copied ahead into
#: dynamic shared memory (kInAhead), likewise.
MMA_IN_AHEAD = 2
#: Dynamic shared memory a block may take (sm_90: 227 KiB).
_DYNAMIC_SMEM_BYTES = 227 * 1024


def _wx_row(cell: Cell, D: int) -> int:
    """A batch row of a step's W x gates (or their cotangents) in shared memory, 16-bit,
    padded to 16 bytes past a multiple of 128 (kWxRow)."""
    row = max(len(cell.gx_names), 1) * D * 2
    return row + (144 - row % 128) % 128


def mma_forward_smem(cell: Cell, D: int) -> int:
    """Block tier, tensor-core forward: bytes of shared memory, h double-buffered and the
    ring of W x slots (a slot: 8 batch rows of ``_wx_row`` bytes)."""
    h = 2 * BATCH_CHUNK * (_k_tiles(D) * 16 + 8) * 2
    return h + ((MMA_WX_AHEAD + 1) * BATCH_CHUNK * _wx_row(cell, D) if cell.gx_names else 16)


def _in_row(nbytes: int, mod: int) -> int:
    """A row of one input in a ring slot: padded to ``mod`` bytes past a multiple of 128."""
    return nbytes + (mod + 128 - nbytes % 128) % 128


def mma_backward_smem(cell: Cell, D: int) -> tuple[int, int]:
    """Block tier, tensor-core backward: bytes of static shared memory (dg and dWx
    double-buffered, the biases and params) and of dynamic shared memory (the ring of step
    inputs: per slot the saved states and R·h as float, W x and dy as 16-bit, 8 batch rows
    each)."""
    gr, kp = max(len(cell.gr_names), 1), _k_tiles(D) * 16
    static = 2 * BATCH_CHUNK * (gr * kp + 8) * 2
    static += 2 * BATCH_CHUNK * _wx_row(cell, D) if cell.gx_names else 2 * 16
    static += (max(len(cell.gb_names), 1) + max(len(cell.params), 1)) * kp * 4
    slot = BATCH_CHUNK * (
        (len(cell.state_names) + len(cell.gr_names)) * _in_row(D * 4, 32)
        + (len(cell.gx_names) + len(cell.outputs)) * _in_row(D * 2, 16)
    )
    return static, (MMA_IN_AHEAD + 1) * (slot + 16)


def _mma_support(cell: Cell, D: int) -> str | None:
    warps, regs = mma_warps(D), mma_fragment_registers(cell, D)
    if warps > MMA_BLOCK_WARPS:
        return (
            f"head dim {D} needs {warps} warps of 8 units; the block tier takes at most "
            f"{MMA_BLOCK_WARPS}"
        )
    if regs > MMA_FRAGMENT_REGISTERS:
        return (
            f"head dim {D}: R as mma fragments needs {regs} registers per thread "
            f"(> {MMA_FRAGMENT_REGISTERS})"
        )
    if mma_forward_smem(cell, D) > _SMEM_BYTES:
        return (
            f"head dim {D}: h and {MMA_WX_AHEAD + 1} steps of W x "
            f"({len(cell.gx_names)} gates) do not fit 48 KiB of shared memory"
        )
    static, ring = mma_backward_smem(cell, D)
    if static > _SMEM_BYTES:
        return (
            f"head dim {D}: the backward's dg and dWx ({len(cell.gx_names)} gates), "
            f"double-buffered, biases and params ({len(cell.params)}) do not fit 48 KiB of "
            "shared memory"
        )
    if static + ring > _DYNAMIC_SMEM_BYTES:
        return (
            f"head dim {D}: dg and {MMA_IN_AHEAD + 1} steps of the backward's inputs do not "
            "fit 227 KiB of shared memory"
        )
    return None


def _k_tiles(D: int) -> int:
    return -(-D // 16)


def _gate_pairs(cell: Cell) -> int:
    """The m tiles of R·h: gate pairs, at least one (kPairs in fused_mma_common.cuh.j2)."""
    return max(-(-len(cell.gr_names) // 2), 1)


def grid_warps(cell: Cell, D: int) -> tuple[int, int]:
    """Grid tier: the warps over which a block splits the k of R·h (16 / gate pairs k tiles
    each, so that R's fragments take at most 64 registers) and of dgᵀ·R (24 gate-row k tiles
    each while that takes at most 8 warps, else 32); at least one (fused_grid.cuh.j2). These are
    the narrow blocks' (8 units), which run every supported size; the wide blocks' (16 units)
    are built in addition where they fit (``kWide`` there)."""
    gr = max(len(cell.gr_names), 1)
    fw_kt = max(1, 16 // _gate_pairs(cell))
    bw = -(-(gr * _k_tiles(D)) // 24)
    return -(-_k_tiles(D) // fw_kt), bw if bw <= 8 else -(-(gr * _k_tiles(D)) // 32)


#: The grid tier's wide blocks (16 units each) are built for cells with at most this many
#: states plus params, at head dims up to ``WIDE_MAX_HEAD_DIM``: a wide block has 384 threads,
#: so 168 registers each, of which R's fragments take 64. ptxas spilled in the wide kernels of
#: the sLSTM (4 states) and the peephole LSTM (2 states, 3 params) at 768 units, and of the MGU
#: at 1024; none of the other examples' at 256 and 768.
WIDE_MAX_STATE_WORDS = 2
WIDE_MAX_HEAD_DIM = 768


def grid_wide(cell: Cell, D: int) -> bool:
    """Whether the grid tier builds wide blocks (16 units, half the exchange bytes per block
    and step) besides the narrow ones for ``cell`` at head dim ``D``; see
    ``WIDE_MAX_STATE_WORDS``. The kernels also need the wide products to fit 12 warps
    (``kWide`` in fused_grid.cuh.j2)."""
    return len(cell.states) + len(cell.params) <= WIDE_MAX_STATE_WORDS and D <= WIDE_MAX_HEAD_DIM


def exchange_words(cell: Cell, D: int) -> int:
    """Grid tier: 16-bit exchange values per (head, batch row): the backward's gate rows in
    fragment order (whole pairs of k tiles; the forward's h fits in them). The host allocates
    ``2 * NH * B8`` rows of them (``B8``: the batch rounded up to 8), then the counters
    (``rnncc_abi.h``)."""
    return 32 * -(-(max(len(cell.gr_names), 1) * _k_tiles(D)) // 2)


def _grid_smem(cell: Cell, D: int) -> tuple[int, int]:
    """Grid tier, 8 batch rows per block: the shared memory of the forward (the warps' partial
    R·h) and of the backward (the partial dgᵀ·R, the block's biases and params)."""
    fw_warps, bw_warps = grid_warps(cell, D)
    fw = fw_warps * _gate_pairs(cell) * 4 * 32 * 4
    side = max(len(cell.gb_names), 1) + max(len(cell.params), 1)
    bw = bw_warps * 4 * 32 * 4 + side * 8 * 4
    return fw, bw


def _grid_support(cell: Cell, D: int) -> str | None:
    pairs = _gate_pairs(cell)
    if D > MAX_GRID_HEAD_DIM:
        return f"head dim {D} > {MAX_GRID_HEAD_DIM}: a head's blocks no longer fit the GPU at once"
    if pairs > 16:
        return f"{len(cell.gr_names)} R h gates: one k tile of R takes {4 * pairs} registers (> 64)"
    if max(grid_warps(cell, D)) > 32:
        return f"head dim {D}: the product's k needs more than 32 warps per block"
    if max(_grid_smem(cell, D)) > _GRID_SMEM_BYTES:
        return f"head dim {D}: a block's partial products do not fit 227 KiB of shared memory"
    return None


def fused_tier(cell: Cell, D: int, dtype: str = "bfloat16") -> str | None:
    """``"block"`` or ``"grid"``: the tier whose kernels run head dim ``D`` for storage
    ``dtype``; None when neither does (``fused_support`` says why)."""
    if fused_support(cell, D, dtype) is not None:
        return None
    return "grid" if dtype != "float32" and _mma_support(cell, D) is not None else "block"


def fused_support(cell: Cell, D: int, dtype: str = "bfloat16") -> str | None:
    """None when a fused kernel handles head dim ``D`` for storage ``dtype``
    (``"float32"``, ``"float16"`` or ``"bfloat16"``); else the reason it does not. float32
    runs the block tier's FFMA kernels, whose product is fp32-accurate (their limits are also
    the kernels' static_asserts; no fp32-accurate multi-SM product is built). The 16-bit
    dtypes run the tensor-core kernels: the block tier where R's fragments fit the register
    budget of one block (``MMA_FRAGMENT_REGISTERS``, which keeps them free of spills, as the
    nvcc test checks), else the grid tier up to ``MAX_GRID_HEAD_DIM``."""
    if dtype == "float32":
        reason = _ffma_support(cell, D)
        return None if reason is None else f"float32 (FFMA product): {reason}"
    if dtype in ("float16", "bfloat16"):
        block = _mma_support(cell, D)
        if block is None:
            return None
        grid = _grid_support(cell, D)
        if grid is None:
            return None
        return f"{dtype} (tensor-core product): block tier: {block}; grid tier: {grid}"
    raise ValueError(f"fused kernels store float32, float16 or bfloat16; got {dtype!r}")


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


def generate_fused(cell: Cell, bwd: BackwardCell, D: int) -> GeneratedSource:
    """The fused forward and backward of ``cell`` for head dim ``D``: the FFMA kernels
    (float32, block tier) and the tensor-core kernels (bf16, fp16; block tier, else grid
    tier), each where it supports ``D``."""
    ffma = _ffma_support(cell, D) is None
    mma = _mma_support(cell, D) is None
    grid = not mma and _grid_support(cell, D) is None
    if not (ffma or mma or grid):
        raise ValueError(f"no fused kernel for head dim {D}")
    rec = cell.state_names.index(cell.recurrent) if cell.recurrent else 0
    y_at = "(((long long){o} * a.B + gb) * a.T + t) * NHD + (long long)n * kD + d"
    plan = []
    context: dict[str, object] = {"ffma": None, "mma": None, "grid": None}
    if ffma:
        threads = threads_for(cell, D)
        plan.append(f"float32: FFMA block tier, {threads} threads")
        context["ffma"] = KernelLines(
            update=update_lines(cell, FFMA_LEAVES),
            stores=_stores(
                cell,
                "static_cast<T*>(a.y)[" + y_at + "]",
                "hs[d][b] = rnncc::from_float<float>({v});",
            ),
            backward=backward_lines(bwd, FFMA_BACKWARD),
            threads=threads,
        )
    if mma:
        plan.append(f"bf16/fp16: mma.sync block tier, {32 * mma_warps(D)} threads")
        context["mma"] = KernelLines(
            update=update_lines(cell, MMA_LEAVES),
            stores=_stores(
                cell, MMA_Y, "hsm[(t + 1) & 1][b][d] = rnncc::from_float<T>({v});", MMA_HIST
            ),
            backward=backward_lines(bwd, MMA_BACKWARD),
            threads=32 * mma_warps(D),
        )
    if grid:
        fw_warps, bw_warps = grid_warps(cell, D)
        plan.append(
            f"bf16/fp16: mma.sync grid tier, {-(-D // 8)} narrow"
            + (f" or {-(-D // 16)} wide" if grid_wide(cell, D) else "")
            + f" blocks per head and batch chunk, {fw_warps} / {bw_warps} product warps (narrow)"
        )
        publish = (
            "rnncc::xchg_put(ex.slot(t + 1) + xchg_at(gb, rnncc::frag_pos(d)), "
            "rnncc::from_float<T>({v}));"
        )
        h = [publish.format(v=f"new_{cell.recurrent}")] if cell.recurrent else []
        context["grid"] = KernelLines(
            update=update_lines(cell, MMA_LEAVES),
            stores=_to_registers(cell) + h,
            backward=backward_lines(bwd, GRID_BACKWARD),
            threads=32 * fw_warps,
            late=_late_stores(cell, MMA_Y, MMA_HIST),
            wide=grid_wide(cell, D),
        )
    text = render_template(
        "fused_block.cu.j2",
        header=header_comment(cell, "; ".join(plan)),
        rec=rec,
        D=D,
        BC=BATCH_CHUNK,
        wx_ahead=MMA_WX_AHEAD,
        in_ahead=MMA_IN_AHEAD,
        **context,
        **cell_context(cell),
    )
    return GeneratedSource(f"{cell.name}_fused_d{D}.cu", text)
