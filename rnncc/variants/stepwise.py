"""Stepwise: per step one batched matrix product and one generated pointwise kernel.

Runs any size and every storage dtype; the host loop (``templates/stepwise_host.cpp``)
launches both kernels each step, so a step costs launches rather than arithmetic at the sizes
rnncc targets. The fallback, and the baseline the fused variants are checked against.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rnncc.variants.base import Cost, Launch, Point, Variant
from rnncc.variants.costs import (
    STEPWISE_BACKWARD_US,
    STEPWISE_FLOPS_PER_US,
    STEPWISE_R_BYTES_PER_US,
    STEPWISE_STEP_US,
    STEPWISE_TENSOR_FLOPS_PER_US,
)

if TYPE_CHECKING:
    from rnncc.codegen.source import GeneratedSource
    from rnncc.ir.cell import BackwardCell, Cell
    from rnncc.tiling.hardware import HardwareCaps
    from rnncc.tiling.problem import Problem

#: Threads of a block of the pointwise kernels (one thread per element).
THREADS = 256
#: The build record: the stepwise library does not depend on the sizes.
BUILD = {"variant": "stepwise", "threads": THREADS}


def render_stepwise(cell: Cell, bwd: BackwardCell, threads: int = THREADS) -> GeneratedSource:
    """The stepwise library of ``cell``, ``threads`` per block (the same for every size)."""
    from rnncc.codegen.source import render_cell

    return render_cell(
        cell,
        bwd,
        filename=f"{cell.name}_stepwise.cu",
        plan=f"stepwise: one thread per (head, batch, unit), {threads} per block",
        skeleton="stepwise.cuh",
        traits=[("int", "kThreads", threads)],
        fast=False,
    )


class Stepwise(Variant):
    name = "stepwise"
    summary = "per step a batched matrix product and a generated pointwise kernel"
    dtypes = ("fp32", "fp16", "bf16")
    host = "stepwise"

    def build(self, problem: Problem, caps: HardwareCaps | None = None) -> dict[str, Any]:
        return dict(BUILD)

    def runs_timeline(self, build: Any) -> bool:
        return True  # read at run time: a step is one element per thread

    def launch(self, problem: Problem, caps: HardwareCaps, point: Point) -> Launch:
        return Launch(None, None)

    def cost(self, problem: Problem, caps: HardwareCaps, point: Point) -> Cost:
        p = problem
        r_elements = max(p.gates_r, 1) * p.heads * p.head_dim**2
        flops = 2 * p.batch * r_elements
        # each step reads R from memory and multiplies it by the batch's h, in float32
        product = max(
            r_elements * p.dtype_bytes / STEPWISE_R_BYTES_PER_US, flops / STEPWISE_FLOPS_PER_US
        )
        # the backward: that product with Rᵀ each step, and dR's share of one GEMM over all steps
        d_r = product if p.dtype_bytes == 4 else flops / STEPWISE_TENSOR_FLOPS_PER_US
        terms = (("launches", STEPWISE_STEP_US), ("product", product))
        forward = STEPWISE_STEP_US + product
        return Cost(terms, 1, forward, STEPWISE_BACKWARD_US + product + d_r)

    def render(self, cell: Cell, bwd: BackwardCell, build: Any) -> GeneratedSource:
        return render_stepwise(cell, bwd, build["threads"])
