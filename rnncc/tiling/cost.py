"""The cost model: a feasible point → estimated µs per step, forward and backward.

Input: a ``Model`` (problem + caps) and a ``Point`` with its ``Layout``. Output: a frozen
``Cost`` whose terms add up to the unit's step time; ``forward_us`` multiplies by the waves
of units the device runs one after the other and is floored by the HBM traffic of a step.

Per block and step (cycles at ``caps.clock_ghz``, or µs where measured so):
  barrier     DESIGN.md §3's measured table, in µs, by kind;
  mma         max(the tensor cores' throughput, the serial chain of k-steps of one
              accumulator); tf32×3 is three MMAs at TF32's half rate plus the split;
  smem        the part of R not in registers and the h (B) fragments streamed from shared
              memory, partly overlapped with the MMAs;
  split-K     the shared-memory reduction of the warps_k partial accumulators;
  pointwise   max(MUFU and ALU throughput of the cell's op mix, its dependency latency);
  exchange    h to the other blocks of the unit: shared memory (block), DSMEM (cluster),
              L2 round trip (grid) — measured on an H100.
The backward reuses the product (Rᵀ·dg has the same FMAs), scales the pointwise work, and
replaces the h exchange by the cross-block reduction of the dh partial sums that splitting R
by rows requires.

Invariants: pure and deterministic. Non-goals: absolute accuracy — the constants are H100
measurements of loops shaped like the fused kernel's (mma.sync, DSMEM, L2 exchange) or public
figures (wgmma, MUFU), to be recalibrated against the fused kernel's own timings; the
one-time load of R; instruction-cache and bank-conflict effects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rnncc.tiling.model import MMA_KINDS, Layout, Model, Point, unit_slots

# Per-step barriers, measured on an H100 80GB HBM3 with CUDA 13.0 (DESIGN.md §3).
BLOCK_BARRIER_US = 0.02  # __syncthreads
BLOCK_BARRIERS_PER_STEP = 2  # one h buffer: after the reads and after the writes
CLUSTER_BARRIER_US = (0.46, 0.69)  # 2 and 16 blocks; linear in between
GRID_BARRIER_US = (1.08, 1.12)  # cooperative grid.sync, 1 and 132 blocks

MMA_LATENCY = 26  # cycles between dependent mma.sync m16n8k16 (measured, H100)
WGMMA_LATENCY = 128  # cycles from the first wgmma to wait_group of a step
WGMMA_EFFICIENCY = 0.85  # of peak at large N; small N is bound by the A-operand feed:
WGMMA_N_HALF = 16  # efficiency = WGMMA_EFFICIENCY × N / (N + WGMMA_N_HALF)
TF32_RATE = 0.5  # TF32 MMA throughput relative to bf16
TF32_SPLIT_ALU = 2  # cvt.rna.tf32 + sub per operand element to form hi and lo
SMEM_OVERLAP = 0.5  # fraction of the shorter of (MMA, shared-memory stream) not hidden;
# measured: a third (half) of R via ldmatrix added 45 % (67 %) to an 8-warp mma.sync step,
# this model says 37 % (61 %)
MUFU_LATENCY = 20  # cycles
ALU_LATENCY = 4
POINTWISE_CRITICAL_PATH = 0.5  # fraction of the cell's instructions on its critical path
# The exchange of h between the blocks of a unit (measured on the H100, beyond the barrier
# itself): a cluster of 16 pushing 12 KiB per SM through DSMEM took 1.1 µs more per step with
# 8 clusters running, 0.7 µs alone (rate in HardwareCaps.dsmem_gbs_per_sm); a grid of 96-128
# blocks pulling 8-32 KiB each from L2 after grid.sync took 0.48 µs + bytes at 41 GB/s/SM.
DSMEM_LATENCY_US = 0.05
GRID_EXCHANGE_LATENCY_US = 0.48
BACKWARD_POINTWISE_FACTOR = 2.5  # backward cell instructions per forward instruction


@dataclass(frozen=True)
class Cost:
    """Estimated µs per step. The terms before ``unit_us`` add up to it."""

    barrier_us: float
    mma_us: float  # product, with the shared-memory stream of R and h overlapped
    smem_us: float  # the shared-memory stream alone (for explain)
    splitk_us: float
    pointwise_us: float
    exchange_us: float
    unit_us: float  # one step of one unit
    waves: int
    hbm_us: float  # the step's Wx reads and y writes at HBM bandwidth, all units together
    forward_us: float
    reduction_us: float  # backward: cross-block dh partial sums
    backward_us: float

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def barrier_us(tier: str, blocks_per_unit: int, grid_blocks: int, elementwise: bool) -> float:
    """Per-step synchronisation of one unit (``grid_blocks``: blocks of the launch)."""
    if elementwise:
        return 0.0  # every thread owns its elements for the whole sequence
    if tier == "block":
        return BLOCK_BARRIERS_PER_STEP * BLOCK_BARRIER_US
    if tier == "cluster":
        lo, hi = CLUSTER_BARRIER_US
        return lo + (hi - lo) * (min(blocks_per_unit, 16) - 2) / 14
    lo, hi = GRID_BARRIER_US
    return lo + (hi - lo) * (min(grid_blocks, 132) - 1) / 131


def _mma_cycles(model: Model, pt: Point, lay: Layout) -> float:
    caps = model.caps
    if pt.mma == "none":
        return 0.0
    bps = pt.blocks_per_sm
    k_per_warp = lay.k_tiles // pt.warps_k
    if pt.mma == "wgmma":
        n = lay.batch_chunk_padded
        rate = caps.wgmma_fma_per_clk * WGMMA_EFFICIENCY * n / (n + WGMMA_N_HALF)
        fmas = lay.rows_per_block * pt.head_dim_padded * n  # each row spans its head's K
        instr_per_group = (lay.m_tiles // pt.warps_m) * k_per_warp  # m64 tiles × k-steps
        return max(fmas * bps / rate, WGMMA_LATENCY + 4 * instr_per_group)
    kind = MMA_KINDS[pt.mma]
    m, n, k = kind.tile
    per_instr = m * n * k
    rate = caps.mma_fma_per_clk * (TF32_RATE if pt.mma == "tf32x3" else 1.0)
    repeats = 3 if pt.mma == "tf32x3" else 1
    cycles_per_instr = per_instr / (rate / 4)  # one tensor core per SM sub-partition
    instr_per_warp = repeats * (lay.m_tiles // pt.warps_m) * lay.n_tiles * k_per_warp
    warps_per_subpartition = -(-(pt.warps_m * pt.warps_k * bps) // 4)
    throughput = warps_per_subpartition * instr_per_warp * cycles_per_instr
    latency = repeats * k_per_warp * MMA_LATENCY
    cycles = max(throughput, latency)
    if pt.mma == "tf32x3":
        operands = lay.r_bytes // 4 + pt.warps_m * pt.head_dim_padded * lay.batch_chunk_padded
        cycles += operands * TF32_SPLIT_ALU * bps / caps.fp32_fma_per_clk
    return cycles


def _smem_cycles(model: Model, pt: Point, lay: Layout) -> float:
    if pt.mma == "none":
        return 0.0
    es = model.problem.dtype_bytes
    readers = pt.warps_m // 4 if pt.mma == "wgmma" else pt.warps_m
    h_bytes = max(readers, pt.heads_per_unit) * pt.head_dim_padded * lay.batch_chunk_padded * es
    return (lay.r_smem_bytes + h_bytes) * pt.blocks_per_sm / model.caps.smem_bytes_per_clk


def _splitk_cycles(model: Model, pt: Point, lay: Layout) -> float:
    if pt.warps_k == 1:
        return 0.0
    traffic = 2 * lay.rows_per_block * lay.batch_chunk_padded * 4 * pt.warps_k
    return traffic * pt.blocks_per_sm / model.caps.smem_bytes_per_clk


def _pointwise_cycles(model: Model, pt: Point, lay: Layout, factor: float = 1.0) -> float:
    p, caps = model.problem, model.caps
    per_element = p.mufu_ops / caps.mufu_per_clk + p.alu_ops / caps.fp32_fma_per_clk
    throughput = lay.elements_per_block * pt.blocks_per_sm * per_element
    latency = (p.mufu_ops * MUFU_LATENCY + p.alu_ops * ALU_LATENCY) * POINTWISE_CRITICAL_PATH
    return factor * max(throughput, latency)


def _blocks_at_once(model: Model, pt: Point, lay: Layout) -> int:
    slots = unit_slots(model.caps, pt.tier, pt.blocks_per_unit, pt.blocks_per_sm)
    return min(lay.n_units, max(1, slots)) * pt.blocks_per_unit


def _transfer_us(model: Model, pt: Point, lay: Layout, bytes_per_elem: int) -> float:
    """µs to give every block of a unit the block's slice of a [D, batch] vector (the h
    broadcast forward, the dh partial sums backward), by tier."""
    caps = model.caps
    slice_bytes = lay.elements_per_block * bytes_per_elem
    full_bytes = pt.heads_per_unit * pt.head_dim_padded * lay.batch_chunk_padded * bytes_per_elem
    if pt.tier == "block":
        return slice_bytes / caps.smem_bytes_per_clk * 1e-3 / caps.clock_ghz
    if pt.tier == "cluster":
        pushed = slice_bytes * pt.blocks_per_unit
        return DSMEM_LATENCY_US + pushed / (max(caps.dsmem_gbs_per_sm, 1e-9) * 1e3)
    per_sm = full_bytes / (caps.l2_gbs_per_sm * 1e3)
    chip = full_bytes * _blocks_at_once(model, pt, lay) / (caps.l2_gbs * 1e3)
    return GRID_EXCHANGE_LATENCY_US + max(per_sm, chip)


def waves(model: Model, pt: Point, lay: Layout) -> int:
    """Rounds of units the device runs one after the other."""
    slots = unit_slots(model.caps, pt.tier, pt.blocks_per_unit, pt.blocks_per_sm)
    return -(-lay.n_units // max(1, slots))


def estimate(model: Model, pt: Point, lay: Layout) -> Cost:
    """The cost of a feasible point."""
    p, caps = model.problem, model.caps
    us = 1e-3 / caps.clock_ghz  # µs per cycle
    elementwise = p.gates_r == 0
    barrier = barrier_us(pt.tier, pt.blocks_per_unit, _blocks_at_once(model, pt, lay), elementwise)
    mma = _mma_cycles(model, pt, lay)
    smem = _smem_cycles(model, pt, lay)
    product = max(mma, smem) + SMEM_OVERLAP * min(mma, smem)
    splitk = _splitk_cycles(model, pt, lay)
    pointwise = _pointwise_cycles(model, pt, lay)
    exchange = 0.0 if elementwise else _transfer_us(model, pt, lay, p.dtype_bytes)
    splitk_barrier = BLOCK_BARRIER_US if pt.warps_k > 1 else 0.0
    unit = barrier + splitk_barrier + (product + splitk + pointwise) * us + exchange
    n_waves = waves(model, pt, lay)
    step_bytes = p.batch * p.heads * p.head_dim * p.dtype_bytes * (p.gates_in + 1)
    hbm = step_bytes / (caps.hbm_gbs * 1e3)  # bytes / (GB/s) in µs
    forward = max(n_waves * unit, hbm)

    # Backward: dh = Rᵀ·dg, split the same way; dg stays with the rows' block, dh needs the
    # fp32 partial sums of all blocks of a head (one reduction per step, no h broadcast).
    reduction = 0.0
    if not elementwise and pt.blocks_per_unit > 1:
        reduction = _transfer_us(model, pt, lay, 4)
    pointwise_bwd = _pointwise_cycles(model, pt, lay, BACKWARD_POINTWISE_FACTOR)
    unit_bwd = barrier + splitk_barrier + (product + splitk + pointwise_bwd) * us + reduction
    backward = max(n_waves * unit_bwd, 2 * hbm)
    return Cost(
        barrier_us=barrier + splitk_barrier,
        mma_us=product * us,
        smem_us=smem * us,
        splitk_us=splitk * us,
        pointwise_us=pointwise * us,
        exchange_us=exchange,
        unit_us=unit,
        waves=n_waves,
        hbm_us=hbm,
        forward_us=forward,
        reduction_us=reduction,
        backward_us=backward,
    )
