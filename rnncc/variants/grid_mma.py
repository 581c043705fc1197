"""Grid MMA: the fused tensor-core kernels for heads whose R does not fit one SM.

A head's units are split over blocks of 8 (narrow, ``unit_tiles`` 1) or 16 (wide, 2) units,
each keeping its part of R in registers as mma fragments (wide blocks past 1024 units: the
first k tiles of each warp there, the rest in shared memory), the product's k split over the
block's warps; a block also owns ``n_tiles`` × 8 batch rows. h (forward) and dg (backward)
go through an exchange buffer in global memory behind a counter per batch chunk, each block
waiting only for the values it reads. Every block of a launch must be resident at once (a
cooperative launch of at most ``blocks_per_sm`` per SM, a number the SM holds whatever
registers the compiled kernel takes); (head, chunk) pairs beyond that run in further launches.

bf16 and fp16 run ``mma.sync.m16n8k16``; fp32 runs each k16 tile as 3xTF32 (six
``m16n8k8.tf32``: big·big + big·small + small·big of each operand's split into a tf32 part
and the tf32 rest, about fp32's accuracy) on the same fragment layout, each register a pair
of floats: fp32 takes twice the registers, shared memory and exchange bytes per value, and
runs on narrow blocks only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from rnncc.variants.base import (
    BATCH_CHUNK,
    Constraint,
    Cost,
    KernelLaunch,
    Launch,
    Point,
    Variant,
    cdiv,
    timeline_record,
)
from rnncc.variants.costs import (
    GRID_GATHER_BYTES_PER_US,
    GRID_SM_GATHER_BYTES_PER_US,
    GRID_STEP_US,
    SMEM_BYTES_PER_CLK,
    STREAM_BYTES_PER_US,
    STREAM_L2_CLAIM_BW,
    STREAM_L2_CLAIM_FW,
    STREAM_L2_PERSISTING_BYTES,
    STREAM_L2_RESIDENT_BYTES,
    cycles_us,
    mma_us,
    pointwise_us,
)

if TYPE_CHECKING:
    from rnncc.codegen.source import GeneratedSource
    from rnncc.ir.cell import BackwardCell, Cell
    from rnncc.tiling.hardware import HardwareCaps
    from rnncc.tiling.problem import Problem

#: The kernels a grid_mma library holds, (n_tiles, unit_tiles) in the order they are built;
#: grid_stream's are its blocks of 32 units (unit_tiles 4).
KERNELS = ((1, 1), (1, 2), (2, 2), (4, 2), (2, 1), (4, 1), (8, 1))
STREAM_KERNELS = ((1, 4), (2, 4))
#: The block widths (unit tiles) whose sizes the template's trait arrays hold, in order.
WIDTHS = (1, 2, 4)
#: Wide blocks (16 units: 384 threads at most, so 168 registers each, R's fragments 64 of
#: them) only for cells with at most this many states plus params, up to this head dim on
#: Hopper: larger ones spill.
WIDE_MAX_STATE_WORDS = 2
WIDE_MAX_HEAD_DIM = 768
#: The largest head dim of wide blocks on the other archs (sm_80, sm_86, sm_89), whose ptxas
#: allocates the wide backward differently: past it the LSTM's (4 gates, the most of the cells
#: wide blocks take) spills there.
WIDE_MAX_HEAD_DIM_BEFORE_HOPPER = 448
#: Narrow blocks (8 units, R in registers) up to this head dim: past it their product takes
#: more warps than leave registers for R, and wide blocks hold it.
NARROW_MAX_HEAD_DIM = 1024
#: Warps a block's product may take: narrow, wide and streaming.
MAX_WARPS = {1: 32, 2: 12, 4: 8}
BACKWARD_FACTOR = 1.6
#: What a wide block's backward step of one n tile costs beyond BACKWARD_FACTOR for cells
#: with R and WIDE_MAX_STATE_WORDS states plus params (the LSTM among the examples), up to
#: NARROW_MAX_HEAD_DIM, at 4 product warps; half that at 8, none from 12. ptxas schedules each
#: of its loads of dg behind the mma that read the registers of the one before, and fewer
#: warps, or fewer n tiles, hide less of it (a fit to the times in benchmarks/results/
#: backward-points-h100-2026-11-27.txt and -27b.txt).
WIDE_BACKWARD_EXTRA_US = 0.6
#: Past NARROW_MAX_HEAD_DIM (Hopper only), wide blocks split R between registers and shared
#: memory: this many product warps (256 threads, so 255 registers each), their first k tiles'
#: fragments in at most this many registers per thread (forward, backward), the others in
#: shared memory, read each step (the fragment store). More registers spill.
SPLIT_WARPS = 8
SPLIT_FW_REGISTERS = 96
SPLIT_BW_REGISTERS = 64
#: Streaming blocks' forward: R's fragments in at most this many registers per thread (its
#: loads from global memory take the rest: more spill).
STREAM_FW_REGISTERS = 64


#: fp32's forward: its k tiles over at most this many warps (384 threads: 168 registers
#: each), else over half as many with twice the k tiles (more warps leave too few registers
#: a thread); and blocks of at most 4 n tiles (more spill).
FP32_FORWARD_WARPS = 12
FP32_KERNELS = ((1, 1), (2, 1), (4, 1))
#: Narrow blocks' backward: R's fragments in at most this many registers per thread, the rest
#: of a warp's k tiles in shared memory. With all of them in registers (255 a thread), the
#: backward spills: fp32's for several cells at 768 and 1024 units, the 16-bit one for the
#: LSTM, sLSTM and peephole LSTM at 1024.
NARROW_BW_REGISTERS = 48
#: fp32's backward step against its forward step: a fit to benchmarks/fp32_speed.py's points
#: on an H100.
FP32_BACKWARD_FACTOR = 2.1
#: Tensor-core time of a k16 tile in fp32 (3xTF32: three products, each two m16n8k8.tf32 at
#: half the 16-bit rate) against bf16's one m16n8k16.
TF32X3_FACTOR = 6


def reg_words(p: Problem) -> int:
    """32-bit words of one fragment register: a pair of 16-bit values (1) or of floats (2)."""
    return p.dtype_bytes // 2


def k_tiles(p: Problem) -> int:
    return cdiv(p.head_dim, 16)


def gate_pairs(p: Problem) -> int:
    """The m tiles of R·h per unit tile: gate pairs, at least one."""
    return max(cdiv(p.gates_r, 2), 1)


def gate_tiles(p: Problem) -> int:
    """k tiles of dgᵀ·R: the gate rows, gate-major, of the head dim padded to 16."""
    return max(p.gates_r, 1) * k_tiles(p)


def split(p: Problem, uw: int) -> bool:
    """Whether blocks keep part of R outside registers: wide ones past NARROW_MAX_HEAD_DIM
    (in shared memory), streaming ones always (in shared memory, the rest in global memory)."""
    return uw == 4 or (uw == 2 and p.head_dim > NARROW_MAX_HEAD_DIM)


def fragments(p: Problem, uw: int, backward: bool) -> int:
    """A k tile's fragments of R in a block (16 bytes a lane each, fp32 32): forward, one per
    m tile (the gate pairs of each unit tile); backward, narrow one B fragment (8 bytes, fp32
    16), else one A fragment of Rᵀ per 16 units."""
    if backward:
        return max(uw // 2, 1)
    return uw * gate_pairs(p)


def forward_warps(p: Problem, uw: int) -> tuple[int, int]:
    """(warps, k tiles each) of R·h: 16 k tiles' fragments per warp at most (64 registers),
    fewer where the block's gate pairs take more; fp32 (two words a register) half as many
    while that takes at most FP32_FORWARD_WARPS warps; split blocks: SPLIT_WARPS warps."""
    if split(p, uw):
        return SPLIT_WARPS, cdiv(k_tiles(p), SPLIT_WARPS)
    per_tile = gate_pairs(p) * uw
    kt = 1 if per_tile >= 16 else 16 // per_tile
    if p.dtype == "fp32" and cdiv(k_tiles(p), max(kt // 2, 1)) <= FP32_FORWARD_WARPS:
        kt = max(kt // 2, 1)
    w = cdiv(k_tiles(p), kt)
    return w, cdiv(k_tiles(p), w)


def backward_warps(p: Problem, uw: int) -> tuple[int, int]:
    """(warps, k tiles each) of dgᵀ·R. Narrow (R as B fragments, 2 registers per k tile): 24
    k tiles per warp while that takes at most 8 warps, else 32. Wide (R as A fragments, 4
    per k tile): 8 k tiles per warp while that takes at most 12 warps, else 16; split blocks:
    SPLIT_WARPS warps. (fp32's fragments take twice the registers, but more warps would lower
    a thread's share of the registers more, and spill.)"""
    g = gate_tiles(p)
    if split(p, uw):
        return SPLIT_WARPS, cdiv(g, SPLIT_WARPS)
    if uw == 2:
        w = cdiv(g, 8) if cdiv(g, 8) <= 12 else cdiv(g, 16)
    else:
        w = cdiv(g, 24) if cdiv(g, 24) <= 8 else cdiv(g, 32)
    return w, cdiv(g, w)


def _tile_bytes(p: Problem, uw: int, backward: bool) -> int:
    """Bytes of one k tile of a warp's R fragments, all lanes."""
    return fragments(p, uw, backward) * 32 * (8 if backward and uw == 1 else 16) * reg_words(p)


def _tiles(p: Problem, uw: int, backward: bool) -> tuple[int, int, int]:
    """Where a warp's k tiles of R live: (in registers, in shared memory, in global memory).
    All in registers, except in a narrow block's backward (as many as NARROW_BW_REGISTERS
    hold, the rest in shared memory) and on split blocks: the first as many as
    SPLIT_FW_REGISTERS (or SPLIT_BW_REGISTERS) hold, then the rest in shared memory (wide
    blocks), or as many of them as leave room for the partial sums of the widest kernel
    (streaming blocks) and the rest in global memory."""
    warps, kt = (backward_warps if backward else forward_warps)(p, uw)
    per_tile = fragments(p, uw, backward) * (2 if backward and uw == 1 else 4) * reg_words(p)
    if not split(p, uw):
        if backward and uw == 1:
            regs = min(kt, NARROW_BW_REGISTERS // per_tile)
            return regs, kt - regs, 0
        return kt, 0, 0
    budget = SPLIT_BW_REGISTERS if backward else SPLIT_FW_REGISTERS
    if uw == 4 and not backward:
        budget = STREAM_FW_REGISTERS
    regs = min(kt, budget // per_tile)
    if uw != 4:
        return regs, kt - regs, 0
    nt = max(n for n, w in STREAM_KERNELS if w == uw)
    room = LIBRARY_SMEM - (_partial_sums(p, nt, uw, backward) + _side(p, uw) * backward)
    smem = max(0, min(kt - regs, room // (warps * _tile_bytes(p, uw, backward))))
    return regs, smem, kt - regs - smem


def forward_registers(p: Problem, uw: int) -> int:
    """The k tiles of a warp's range of R·h whose fragments stay in registers."""
    return _tiles(p, uw, False)[0]


def backward_registers(p: Problem, uw: int) -> int:
    """As forward_registers for dgᵀ·R."""
    return _tiles(p, uw, True)[0]


def forward_store(p: Problem, uw: int) -> int:
    """Bytes of the forward's fragment store in shared memory."""
    return forward_warps(p, uw)[0] * _tiles(p, uw, False)[1] * _tile_bytes(p, uw, False)


def backward_store(p: Problem, uw: int) -> int:
    """Bytes of the backward's fragment store in shared memory."""
    return backward_warps(p, uw)[0] * _tiles(p, uw, True)[1] * _tile_bytes(p, uw, True)


def streamed_bytes(p: Problem, uw: int, backward: bool) -> int:
    """Bytes of R a block reads from global memory each step (streaming blocks)."""
    warps = (backward_warps if backward else forward_warps)(p, uw)[0]
    return warps * _tiles(p, uw, backward)[2] * _tile_bytes(p, uw, backward)


def threads(warps: int, nt: int, uw: int) -> int:
    """A block's threads: its product warps, or a cell warp per (unit tile, n tile)."""
    return 32 * max(warps, uw * nt)


def _partial_sums(p: Problem, nt: int, uw: int, backward: bool) -> int:
    """Bytes of the warps' partial products, float: R·h's m tiles of each n tile (forward);
    dgᵀ·R's tiles (backward: narrow 16 batch rows by 8 units, else 8 rows by the block's
    units in tiles of 16)."""
    if not backward:
        return forward_warps(p, uw)[0] * uw * gate_pairs(p) * nt * 4 * 32 * 4
    tiles = cdiv(nt, 2) if uw == 1 else nt
    return backward_warps(p, uw)[0] * tiles * fragments(p, uw, True) * 4 * 32 * 4


def _side(p: Problem, uw: int) -> int:
    """The backward's biases and params of the block's units, float."""
    return (max(p.gates_b, 1) + max(p.n_params, 1)) * 8 * uw * 4


def forward_smem(p: Problem, nt: int, uw: int) -> int:
    """The fragment store, then the warps' partial R·h."""
    return forward_store(p, uw) + _partial_sums(p, nt, uw, False)


def backward_smem(p: Problem, nt: int, uw: int) -> int:
    """The fragment store, then the warps' partial dgᵀ·R, and the block's biases and params."""
    return backward_store(p, uw) + _partial_sums(p, nt, uw, True) + _side(p, uw)


def exchange_words(p: Problem) -> int:
    """Exchange values per (head, batch row) (of the storage dtype): dg's gate rows in
    fragment order, whole pairs of k tiles (h fits in them)."""
    return 32 * cdiv(gate_tiles(p), 2)


def blocks_per_head(p: Problem, uw: int) -> int:
    return cdiv(cdiv(p.head_dim, 8), uw)


def hopper(caps: HardwareCaps | None) -> bool:
    """Whether ``caps`` is Hopper's (None: the library's default arch): split and streaming
    blocks are built and checked there only."""
    return caps is None or caps.arch == "sm_90"


def wide_head_dim_limit(caps: HardwareCaps | None) -> int:
    """The largest head dim of wide blocks for the arch of ``caps`` (None: Hopper's)."""
    return WIDE_MAX_HEAD_DIM if hopper(caps) else WIDE_MAX_HEAD_DIM_BEFORE_HOPPER


def wide_allowed(p: Problem, caps: HardwareCaps | None = None, uw: int = 2) -> bool:
    """Whether blocks of ``uw`` unit tiles (2: wide, 4: streaming) build for ``p``: 16-bit
    storage only (fp32's fragments take twice the registers)."""
    if p.dtype == "fp32":
        return False
    if uw == 4 or p.head_dim > NARROW_MAX_HEAD_DIM:
        return hopper(caps)
    return p.n_states + p.n_params <= WIDE_MAX_STATE_WORDS and p.head_dim <= wide_head_dim_limit(
        caps
    )


def fp32_record(problem: Problem) -> dict[str, Any]:
    """The part of a build record that says its kernels store fp32 (3xTF32, fp32's register
    budgets): ``{"dtype": "fp32"}``, else nothing (one library runs bf16 and fp16)."""
    return {"dtype": "fp32"} if problem.dtype == "fp32" else {}


# -- constraints ---------------------------------------------------------------------------


def r_tile_fits_registers(p: Problem, caps: HardwareCaps) -> bool:
    return gate_pairs(p) <= 16


def head_blocks_co_resident(p: Problem, caps: HardwareCaps, uw: int, bps: int) -> bool:
    return blocks_per_head(p, uw) <= bps * caps.sm_count


#: Registers a warp takes at most: 255 per thread, allocated 256 at a time per warp.
WARP_REGISTERS = 8192


def _kernel_of(
    p: Problem, nt: int, uw: int, caps: HardwareCaps | None
) -> tuple[int, dict[str, int]] | None:
    """The library's kernel of blocks (nt, uw) for ``p`` on the arch of ``caps``, with its
    index; None if not built."""
    kernels = STREAM_KERNELS if uw == 4 else KERNELS
    for i, k in enumerate(_kernel_table(p, LIBRARY_SMEM, caps, kernels)):
        if (k["n_tiles"], k["unit_tiles"]) == (nt, uw):
            return i, k
    return None


def blocks_fit_an_sm(p: Problem, caps: HardwareCaps, nt: int, uw: int, bps: int) -> bool:
    """``bps`` blocks of the kernel fit one SM whatever registers ptxas gave its threads (one
    always does: the kernels' launch bounds cap their registers at the SM's share)."""
    found = _kernel_of(p, nt, uw, caps)
    if found is None:
        return True  # kernel_exists says why
    k = found[1]
    threads = max(k["fw_threads"], k["bw_threads"])
    smem = max(k["fw_smem"], k["bw_smem"]) + caps.smem_reserved_per_block
    return (
        bps <= caps.max_blocks_per_sm
        and bps * threads <= caps.max_threads_per_sm
        and (bps == 1 or bps * cdiv(threads, 32) * WARP_REGISTERS <= caps.regs_per_sm)
        and bps * smem <= caps.smem_per_sm
    )


def co_residence_only_when_needed(
    p: Problem, caps: HardwareCaps, nt: int, uw: int, bps: int
) -> bool:
    """More blocks per SM only when fewer would not hold them all at once."""
    blocks = blocks_per_head(p, uw) * p.heads * cdiv(p.batch, 8 * nt)
    return bps == 1 or blocks > bps // 2 * caps.sm_count


def product_warps(p: Problem, caps: HardwareCaps, uw: int) -> bool:
    most = max(forward_warps(p, uw)[0], backward_warps(p, uw)[0])
    return most <= MAX_WARPS[uw] and 32 * most <= caps.max_threads_per_block


def wide_blocks_fit_registers(p: Problem, caps: HardwareCaps, uw: int) -> bool:
    return uw == 1 or wide_allowed(p, caps, uw)


def built_for_hopper(p: Problem, caps: HardwareCaps) -> bool:
    return hopper(caps)


def narrow_blocks_fit_registers(p: Problem, caps: HardwareCaps, uw: int) -> bool:
    return uw != 1 or p.head_dim <= NARROW_MAX_HEAD_DIM


def streams_what_the_chip_cannot_hold(p: Problem, caps: HardwareCaps) -> bool:
    """Streaming blocks only for heads that grid_mma's wide blocks do not hold on chip: more
    of them than the SMs, or their part of R past shared memory even at one n tile."""
    if p.head_dim <= NARROW_MAX_HEAD_DIM or streamed_bytes(p, 4, False) == 0:
        return False
    fits = max(forward_smem(p, 1, 2), backward_smem(p, 1, 2)) <= smem_limit(caps)
    return blocks_per_head(p, 2) > caps.sm_count or not fits


def kernel_exists(p: Problem, caps: HardwareCaps, nt: int, uw: int) -> bool:
    return (nt, uw) in (FP32_KERNELS if p.dtype == "fp32" else KERNELS)


def smem_limit(caps: HardwareCaps) -> int:
    return min(caps.smem_per_block_optin, LIBRARY_SMEM)


def partial_sums_fit_shared_memory(p: Problem, caps: HardwareCaps, nt: int, uw: int) -> bool:
    return max(forward_smem(p, nt, uw), backward_smem(p, nt, uw)) <= smem_limit(caps)


def batch_tiles_needed(p: Problem, caps: HardwareCaps, nt: int) -> bool:
    """More batch rows per block than the batch has only for the smallest tile."""
    return nt == 1 or 8 * (nt // 2) < p.batch


def _kernel_table(
    p: Problem, caps_smem: int, caps: HardwareCaps | None, kernels: tuple = KERNELS
) -> list[dict[str, int]]:
    """The kernels of ``kernels`` a library builds for ``p`` on the arch of ``caps`` (None:
    Hopper)."""
    table = []
    for nt, uw in kernels:
        if p.dtype == "fp32" and (nt, uw) not in FP32_KERNELS:
            continue
        if uw != 1 and not wide_allowed(p, caps, uw):
            continue
        if uw == 1 and p.head_dim > NARROW_MAX_HEAD_DIM:
            continue
        fw, bw = forward_warps(p, uw), backward_warps(p, uw)
        if max(fw[0], bw[0]) > MAX_WARPS[uw]:
            continue
        fs, bs = forward_smem(p, nt, uw), backward_smem(p, nt, uw)
        if max(fs, bs) > caps_smem:
            continue
        table.append(
            {
                "n_tiles": nt,
                "unit_tiles": uw,
                "fw_warps": fw[0],
                "fw_k_tiles": fw[1],
                "bw_warps": bw[0],
                "bw_k_tiles": bw[1],
                "fw_threads": threads(fw[0], nt, uw),
                "bw_threads": threads(bw[0], nt, uw),
                "fw_smem": fs,
                "bw_smem": bs,
                "fw_registers": forward_registers(p, uw),
                "bw_registers": backward_registers(p, uw),
                "fw_smem_tiles": _tiles(p, uw, False)[1],
                "bw_smem_tiles": _tiles(p, uw, True)[1],
                "fw_store": forward_store(p, uw),
                "bw_store": backward_store(p, uw),
            }
        )
    return table


def _traits(build: Any) -> list[tuple[str, str, Any]]:
    """The kernel table and the product splits as the template's constants: arrays over the
    library's kernels, and over the widths of WIDTHS (0 where the library has none)."""
    kernels = build["kernels"]
    by_width = {k["unit_tiles"]: k for k in kernels}

    def table(key: str) -> str:
        return "{" + ", ".join(str(k[key]) for k in kernels) + "}"

    def per_width(key: str) -> str:
        return (
            "{" + ", ".join(str(by_width[w][key]) if w in by_width else "0" for w in WIDTHS) + "}"
        )

    return [
        ("int", "kD", build["D"]),
        ("bool", "kFp32", "true" if build.get("dtype") == "fp32" else "false"),
        ("int", "kBC", build["batch_chunk"]),
        ("int", "kXWords", build["exchange_words"]),
        ("int", "kFwL2Claim", build["fw_l2_claim"]),
        ("int", "kBwL2Claim", build["bw_l2_claim"]),
        ("int", "kGridKernels", len(kernels)),
        ("int", "kGridNT[kGridKernels]", table("n_tiles")),
        ("int", "kGridUW[kGridKernels]", table("unit_tiles")),
        ("int", "kGridFwThreads[kGridKernels]", table("fw_threads")),
        ("int", "kGridBwThreads[kGridKernels]", table("bw_threads")),
        ("size_t", "kGridFwSmem[kGridKernels]", table("fw_smem")),
        ("size_t", "kGridBwSmem[kGridKernels]", table("bw_smem")),
        ("int", "kFwWarps[3]", per_width("fw_warps")),
        ("int", "kFwKT[3]", per_width("fw_k_tiles")),
        ("int", "kBwWarps[3]", per_width("bw_warps")),
        ("int", "kBwKT[3]", per_width("bw_k_tiles")),
        ("int", "kFwRegKT[3]", per_width("fw_registers")),
        ("int", "kBwRegKT[3]", per_width("bw_registers")),
        ("int", "kFwSmemKT[3]", per_width("fw_smem_tiles")),
        ("int", "kBwSmemKT[3]", per_width("bw_smem_tiles")),
        ("int", "kFwStore[3]", per_width("fw_store")),
        ("int", "kBwStore[3]", per_width("bw_store")),
    ]


#: Dynamic shared memory the library's kernels are built for at most (a block's opt-in on
#: sm_90); a device with less rules out, through the constraint, the kernels that need more.
LIBRARY_SMEM = 227 * 1024


# -- constraints both grid variants take --------------------------------------------------

R_TILE = Constraint(
    "r_tile_fits_registers",
    "one k tile of R (4 registers per gate pair) takes at most 64 registers",
    r_tile_fits_registers,
    usage=lambda p, caps, pt: (gate_pairs(p), 16),
)
CO_RESIDENT = Constraint(
    "head_blocks_co_resident",
    "the blocks of one head are resident at once, blocks_per_sm per SM",
    head_blocks_co_resident,
    ("unit_tiles", "blocks_per_sm"),
    usage=lambda p, caps, pt: (
        blocks_per_head(p, pt["unit_tiles"]),
        pt["blocks_per_sm"] * caps.sm_count,
    ),
)
SHARED_MEMORY = Constraint(
    "partial_sums_fit_shared_memory",
    "a block's partial products (and the part of R a split block keeps there) fit its "
    "opt-in shared memory",
    partial_sums_fit_shared_memory,
    ("n_tiles", "unit_tiles"),
    usage=lambda p, caps, pt: (
        max(
            forward_smem(p, pt["n_tiles"], pt["unit_tiles"]),
            backward_smem(p, pt["n_tiles"], pt["unit_tiles"]),
        ),
        smem_limit(caps),
    ),
)
BATCH_TILES = Constraint(
    "batch_tiles_needed",
    "a block takes more batch rows only when the batch has them",
    batch_tiles_needed,
    ("n_tiles",),
)


class GridMma(Variant):
    name = "grid_mma"
    kernels: ClassVar[tuple[tuple[int, int], ...]] = KERNELS
    summary = (
        "mma.sync grid tier: a head's units over co-resident blocks, h exchanged through L2 "
        "(fp32 as 3xTF32)"
    )
    dtypes: ClassVar[tuple[str, ...]] = ("fp16", "bf16", "fp32")
    host = "fused"
    constraints: ClassVar[tuple[Constraint, ...]] = (
        R_TILE,
        Constraint(
            "kernel_exists",
            "the library builds blocks of (n_tiles, unit_tiles) in "
            + ", ".join(str(k) for k in KERNELS)
            + " (fp32: "
            + ", ".join(str(k) for k in FP32_KERNELS)
            + ")",
            kernel_exists,
            ("n_tiles", "unit_tiles"),
        ),
        Constraint(
            "wide_blocks_fit_registers",
            f"wide blocks (16 units) only in 16-bit storage, for cells of at most "
            f"{WIDE_MAX_STATE_WORDS} states "
            f"plus params and head dims ≤ {WIDE_MAX_HEAD_DIM} (Hopper) or "
            f"{WIDE_MAX_HEAD_DIM_BEFORE_HOPPER} (sm_80, sm_86, sm_89); past "
            f"{NARROW_MAX_HEAD_DIM} on Hopper, split between registers and shared memory",
            wide_blocks_fit_registers,
            ("unit_tiles",),
        ),
        Constraint(
            "narrow_blocks_fit_registers",
            f"narrow blocks (8 units, R in registers) only up to head dim {NARROW_MAX_HEAD_DIM}",
            narrow_blocks_fit_registers,
            ("unit_tiles",),
        ),
        Constraint(
            "product_warps",
            "a block's product takes at most 32 warps (narrow) or 12 (wide)",
            product_warps,
            ("unit_tiles",),
        ),
        CO_RESIDENT,
        Constraint(
            "blocks_fit_an_sm",
            "blocks_per_sm blocks fit an SM's threads, shared memory and registers (at 255 per "
            "thread)",
            blocks_fit_an_sm,
            ("n_tiles", "unit_tiles", "blocks_per_sm"),
        ),
        Constraint(
            "co_residence_only_when_needed",
            "more blocks per SM only when fewer do not hold all the blocks at once",
            co_residence_only_when_needed,
            ("n_tiles", "unit_tiles", "blocks_per_sm"),
        ),
        SHARED_MEMORY,
        BATCH_TILES,
    )

    def domains(self, problem: Problem, caps: HardwareCaps) -> dict[str, tuple[Any, ...]]:
        return {"n_tiles": (1, 2, 4, 8), "unit_tiles": (1, 2), "blocks_per_sm": (1, 2, 4)}

    def build(self, problem: Problem, caps: HardwareCaps | None = None) -> dict[str, Any]:
        return {
            "variant": self.name,
            "D": problem.head_dim,
            "batch_chunk": BATCH_CHUNK,
            "exchange_words": exchange_words(problem),
            # thousandths of L2's persisting set-aside a streaming launch's window claims
            "fw_l2_claim": round(1000 * STREAM_L2_CLAIM_FW),
            "bw_l2_claim": round(1000 * STREAM_L2_CLAIM_BW),
            "kernels": _kernel_table(problem, LIBRARY_SMEM, caps, self.kernels),
            **timeline_record(problem),
            **fp32_record(problem),
        }

    def _kernel(
        self, problem: Problem, caps: HardwareCaps, point: Point
    ) -> tuple[int, dict[str, int]]:
        found = _kernel_of(problem, point["n_tiles"], point["unit_tiles"], caps)
        if found is None:
            raise ValueError(
                f"{self.name} builds no kernel for {dict(point)} at {problem.describe()}"
            )
        return found

    def _split(self, problem: Problem, caps: HardwareCaps, point: Point) -> tuple[int, int, int]:
        """(heads per launch, chunks per launch, launches), blocks_per_sm per SM at most."""
        p, nt, uw = problem, point["n_tiles"], point["unit_tiles"]
        units, chunks = blocks_per_head(p, uw), cdiv(p.batch, 8 * nt)
        capacity = point["blocks_per_sm"] * caps.sm_count
        if units * chunks <= capacity:
            heads, per = max(1, min(p.heads, capacity // (units * chunks))), chunks
        else:
            heads, per = 1, max(1, capacity // units)
        return heads, per, cdiv(p.heads, heads) * cdiv(chunks, per)

    def launch(self, problem: Problem, caps: HardwareCaps, point: Point) -> Launch:
        index, k = self._kernel(problem, caps, point)
        heads, chunks, launches = self._split(problem, caps, point)
        grid = (blocks_per_head(problem, point["unit_tiles"]), heads, chunks)
        b8 = cdiv(problem.batch, 8) * 8
        # both slots of values, in 32-bit words (a value is 16 or 32 bits)
        values = problem.heads * b8 * exchange_words(problem) * reg_words(problem)
        words = values + problem.heads * (b8 // 8)
        uw = point["unit_tiles"]
        streamed = max(streamed_bytes(problem, uw, False), streamed_bytes(problem, uw, True))
        l2_from = l2_bytes = 0
        if streamed:  # past the counters from a multiple of 4 words (rnncc_abi.h)
            start, region = cdiv(words, 4) * 4, problem.heads * grid[0] * streamed
            words = start + region // 4
            if region > STREAM_L2_RESIDENT_BYTES:  # what L2 does not keep by itself
                l2_from, l2_bytes = start, region
        return Launch(
            KernelLaunch(index, k["fw_threads"], k["fw_smem"], grid, launches),
            KernelLaunch(index, k["bw_threads"], k["bw_smem"], grid, launches),
            exchange_words(problem),
            words,
            l2_from,
            l2_bytes,
        )

    def cost(self, problem: Problem, caps: HardwareCaps, point: Point) -> Cost:
        p, nt, uw, bps = problem, point["n_tiles"], point["unit_tiles"], point["blocks_per_sm"]
        rows, units = 8 * nt, 8 * uw
        # The gather of a step's h: at a block's rate, and the blocks of an SM share its L2
        # bandwidth. The product and the cell share the SM's units.
        nbytes = rows * p.head_dim * p.dtype_bytes
        gather = max(nbytes / GRID_GATHER_BYTES_PER_US, bps * nbytes / GRID_SM_GATHER_BYTES_PER_US)
        product = bps * mma_us(max(p.gates_r, 1) * units * k_tiles(p) * 16 * rows, caps)
        if p.dtype == "fp32":
            product *= TF32X3_FACTOR
        cell = pointwise_us(p, caps, bps * units * rows)  # co-resident blocks' chains overlap
        terms: tuple[tuple[str, float], ...] = (
            ("wait", GRID_STEP_US),
            ("gather", gather),
            ("product", product),
            ("cell", cell),
        )
        if split(p, uw):  # the part of R in shared memory, read every step
            terms += (("store", cycles_us(bps * forward_store(p, uw) / SMEM_BYTES_PER_CLK, caps)),)
        if streamed := streamed_bytes(p, uw, False):  # and in global memory: HBM, or L2
            step = p.heads * blocks_per_head(p, uw) * streamed  # a step's, every block's
            if step <= STREAM_L2_RESIDENT_BYTES:  # at the whole L2's rate
                terms += (("stream", step / (caps.l2_gbs * 1e3)),)
            else:  # the persisting window's part at L2's rate, the rest at the SM's of HBM
                kept = min(step, STREAM_L2_CLAIM_FW * STREAM_L2_PERSISTING_BYTES)
                terms += (
                    (
                        "stream",
                        kept / (caps.l2_gbs * 1e3)
                        + bps * streamed * (1 - kept / step) / STREAM_BYTES_PER_US,
                    ),
                )
        unit = sum(us for _, us in terms)
        launches = self._split(p, caps, point)[2]
        factor = FP32_BACKWARD_FACTOR if p.dtype == "fp32" else BACKWARD_FACTOR
        backward = unit * factor
        at_limit = p.n_states + p.n_params >= WIDE_MAX_STATE_WORDS
        if uw == 2 and nt == 1 and p.gates_r > 0 and not split(p, uw) and at_limit:
            backward += WIDE_BACKWARD_EXTRA_US * max(0, 12 - backward_warps(p, uw)[0]) / 8
        return Cost(terms, launches, unit * launches, backward * launches)

    def render(self, cell: Cell, bwd: BackwardCell, build: Any) -> GeneratedSource:
        from rnncc.codegen.source import render_fused

        # the cell's fast helpers (tanh.approx: relative error up to about 2^-11) only where
        # the storage is 16-bit
        fast = build.get("dtype") != "fp32"
        return render_fused(cell, bwd, self.name, build, _traits(build), fast=fast)
