"""Block FFMA: the fused float32 kernels, one block per (head, chunk of 8 batch rows).

Each thread keeps one row of the head's R in registers as float, so the product is
fp32-accurate; h and R·h go through static shared memory. Blocks never wait on each other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
from rnncc.variants.costs import block_tier_cost, cycles_us

if TYPE_CHECKING:
    from rnncc.codegen.source import GeneratedSource
    from rnncc.ir.cell import BackwardCell, Cell
    from rnncc.tiling.hardware import HardwareCaps
    from rnncc.tiling.problem import Problem

#: One row of R per thread, as float registers: a row of 64 takes 64 of a thread's registers.
MAX_HEAD_DIM = 64
#: Static shared memory of a block (a CUDA limit on every arch).
STATIC_SMEM_BYTES = 48 * 1024
#: The backward's cotangent cell costs about this many times the forward cell.
BACKWARD_FACTOR = 2.5


def rows(p: Problem) -> int:
    return p.gates_r * p.head_dim


def threads(p: Problem) -> int:
    """One thread per row of the head's R, at least 128, whole warps."""
    return max(128, cdiv(rows(p), 32) * 32)


def groups(p: Problem) -> int:
    """Row slices of the backward's Rᵀ·dg product (one thread per column of R each)."""
    return threads(p) // p.head_dim if rows(p) else 1


def forward_smem(p: Problem) -> int:
    """h and the step's R·h, float."""
    return (p.head_dim * BATCH_CHUNK + BATCH_CHUNK * max(rows(p), 1)) * 4


def backward_smem(p: Problem) -> int:
    """dg and the slices' partial sums of Rᵀ·dg, float."""
    return (p.head_dim * BATCH_CHUNK * groups(p) + BATCH_CHUNK * max(rows(p), 1)) * 4


def row_fits_registers(p: Problem, caps: HardwareCaps) -> bool:
    return p.head_dim <= MAX_HEAD_DIM


def rows_fit_block(p: Problem, caps: HardwareCaps) -> bool:
    return rows(p) <= caps.max_threads_per_block


def forward_fits_shared_memory(p: Problem, caps: HardwareCaps) -> bool:
    return forward_smem(p) <= STATIC_SMEM_BYTES


def backward_fits_shared_memory(p: Problem, caps: HardwareCaps) -> bool:
    return backward_smem(p) <= STATIC_SMEM_BYTES


class BlockFfma(Variant):
    name = "block_ffma"
    summary = "FFMA block tier: one block per (head, 8 batch rows), R rows in registers as float"
    dtypes = ("fp32",)
    host = "fused"
    constraints = (
        Constraint(
            "r_row_fits_registers",
            f"a thread holds one row of R as float: head dim ≤ {MAX_HEAD_DIM}",
            row_fits_registers,
            usage=lambda p, caps, pt: (p.head_dim, MAX_HEAD_DIM),
        ),
        Constraint(
            "r_rows_fit_block",
            "one thread per row of the head's R: gates × head dim ≤ threads per block",
            rows_fit_block,
            usage=lambda p, caps, pt: (rows(p), caps.max_threads_per_block),
        ),
        Constraint(
            "forward_fits_shared_memory",
            f"h and R·h of 8 batch rows fit {STATIC_SMEM_BYTES // 1024} KiB of static shared memory",
            forward_fits_shared_memory,
            usage=lambda p, caps, pt: (forward_smem(p), STATIC_SMEM_BYTES),
        ),
        Constraint(
            "backward_fits_shared_memory",
            "dg and the backward's Rᵀ·dg partial sums fit "
            f"{STATIC_SMEM_BYTES // 1024} KiB of static shared memory",
            backward_fits_shared_memory,
            usage=lambda p, caps, pt: (backward_smem(p), STATIC_SMEM_BYTES),
        ),
    )

    def build(self, problem: Problem, caps: HardwareCaps | None = None) -> dict[str, Any]:
        return {
            "variant": self.name,
            "D": problem.head_dim,
            "batch_chunk": BATCH_CHUNK,
            "threads": threads(problem),
            "groups": groups(problem),
            **timeline_record(problem),
        }

    def launch(self, problem: Problem, caps: HardwareCaps, point: Point) -> Launch:
        grid = (problem.heads, cdiv(problem.batch, BATCH_CHUNK), 1)
        k = KernelLaunch(0, threads(problem), 0, grid)
        return Launch(k, k)

    def cost(self, problem: Problem, caps: HardwareCaps, point: Point) -> Cost:
        # Each thread: its row of R times the 8 columns of h, FFMA at the SM's fp32 rate.
        fmas = threads(problem) * problem.head_dim * BATCH_CHUNK
        product = cycles_us(fmas / caps.fp32_fma_per_clk, caps)
        return block_tier_cost(problem, caps, product, BACKWARD_FACTOR)

    def render(self, cell: Cell, bwd: BackwardCell, build: Any) -> GeneratedSource:
        from rnncc.codegen.source import render_fused

        traits = [
            ("int", "kD", build["D"]),
            ("int", "kBC", build["batch_chunk"]),
            ("int", "kThreads", build["threads"]),
            ("int", "kGroups", build["groups"]),
        ]
        return render_fused(cell, bwd, self.name, build, traits, fast=False)
