"""Cost terms the variants share: per-step fixed costs and the rates of the product and cell.

The fixed costs are fits to the kernels' own per-step times on an H100 80GB HBM3 (T = 1024,
``benchmarks/variant_costs.py`` reports the model against the clock); the rates come from
``HardwareCaps``, so other devices scale by their clocks and SM counts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rnncc.variants.base import BATCH_CHUNK, Cost, cdiv

if TYPE_CHECKING:
    from rnncc.tiling.hardware import HardwareCaps
    from rnncc.tiling.problem import Problem

#: A block-tier step beyond its product and cell: two block barriers, the W x prefetch, the
#: stores of the step's outputs.
BLOCK_STEP_US = 0.25
#: A grid-tier step beyond its product, cell and exchange bytes: publishing h, waiting for
#: the counters of the other blocks, the L2 round trip.
GRID_STEP_US = 1.45
#: The grid tier's exchange: bytes a block gathers from L2 per µs after its wait, and at most
#: the blocks of one SM together.
GRID_GATHER_BYTES_PER_US = 30e3
GRID_SM_GATHER_BYTES_PER_US = 42e3
#: Shared memory an SM reads per clock (the split grid blocks' part of R, each step).
SMEM_BYTES_PER_CLK = 128
#: R streamed from memory: bytes an SM reads per µs (its share of an H100's 3.35 TB/s of HBM;
#: the part of R that L2 keeps comes faster).
STREAM_BYTES_PER_US = 25e3
#: The streamed bytes of a step (all blocks) that L2 keeps from one step to the next, so that
#: they come at L2's rate instead: an H100 kept a 26 MB stream and none of a 53.5 MB one (a
#: cyclic read larger than the cache evicts every line before its reuse).
STREAM_L2_RESIDENT_BYTES = 30e6
#: Of a larger stream, the bytes the launches' persisting L2 window keeps: the largest
#: persisting set-aside of an H100 or H200 (cudaDevAttrMaxPersistingL2CacheSize, 37.5 MiB).
STREAM_L2_PERSISTING_BYTES = 39321600
#: The share of that set-aside a launch's window claims for its persisting lines (its hit
#: ratio: the claim over the window's bytes), forward and backward. Claiming all of it leaves
#: too little of L2 to the rest of the stream; the backward, whose stream runs ahead into L2
#: (bulk prefetches), hardly depends on it (fits to LSTM forward and backward kernel times at
#: 3072 and 4096 units on an H100).
STREAM_L2_CLAIM_FW = 0.85
STREAM_L2_CLAIM_BW = 0.3
#: A stepwise step: a batched matrix product and a pointwise kernel, launched from the host
#: loop (launch-bound at the problem sizes rnncc targets).
STEPWISE_STEP_US = 24.0
STEPWISE_BACKWARD_US = 36.0
#: The stepwise product's rate of reading R (bytes per µs), which sets a step's time once R
#: is large (a fit to an H100's LSTM steps at 2304 and 4096 units: 24 µs plus R at 1.3-1.5
#: TB/s).
STEPWISE_R_BYTES_PER_US = 1.4e6
#: Its rate of arithmetic (flop per µs), which sets a step's time once the batch is large:
#: the step's R h product runs in float32 on the CUDA cores whatever the storage dtype (a fit
#: to an H200's LSTM steps at 768 units, B 1024 and 4096, and 2304 units, B 256 and 1024:
#: 41-45 TFLOPS). The backward's product for dR, in the storage dtype, runs a 16-bit one on
#: the tensor cores (`benchmarks/results/stepwise-batch-h200-2026-11-28.txt`).
STEPWISE_FLOPS_PER_US = 44e6
STEPWISE_TENSOR_FLOPS_PER_US = 600e6


def cycles_us(cycles: float, caps: HardwareCaps) -> float:
    return cycles * 1e-3 / caps.clock_ghz


def pointwise_us(p: Problem, caps: HardwareCaps, elements: int) -> float:
    """The cell on ``elements`` elements of one SM: MUFU and ALU throughput, or the chain of
    one element's dependent instructions, whichever is longer."""
    per_element = p.mufu_ops / caps.mufu_per_clk + p.alu_ops / caps.fp32_fma_per_clk
    chain = (p.mufu_ops * 20 + p.alu_ops * 4) * 0.5
    return cycles_us(max(elements * per_element, chain), caps)


def mma_us(fmas: float, caps: HardwareCaps) -> float:
    """Tensor-core products of ``fmas`` multiply-adds on one SM (mma.sync)."""
    return cycles_us(fmas / caps.mma_fma_per_clk, caps)


def block_waves(blocks: int, caps: HardwareCaps) -> float:
    """How many times longer ``blocks`` independent blocks take than one per SM: blocks that
    share an SM share its issue slots and tensor cores."""
    return max(1.0, blocks / caps.sm_count)


def block_tier_cost(
    p: Problem, caps: HardwareCaps, product_us: float, backward_factor: float
) -> Cost:
    """A block-tier step (one block per head and 8 batch rows, never waiting on another):
    the fixed part, the block's product and its cell, times how much the blocks crowd the
    SMs; the backward as a multiple of the forward."""
    blocks = p.heads * cdiv(p.batch, BATCH_CHUNK)
    cell = pointwise_us(p, caps, p.head_dim * BATCH_CHUNK)
    terms = (("barriers", BLOCK_STEP_US), ("product", product_us), ("cell", cell))
    forward = sum(us for _, us in terms) * block_waves(blocks, caps)
    return Cost(terms, cdiv(blocks, caps.sm_count), forward, forward * backward_factor)
