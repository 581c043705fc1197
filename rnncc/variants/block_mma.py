"""Block MMA: the fused 16-bit kernels for heads whose R fits one block's registers.

One block per (head, chunk of 8 batch rows), one warp per 8 units; R stays in registers as
``mma.sync`` m16n8k16 fragments, the cell runs on the product's accumulators. The forward
copies W x ahead into a ring in static shared memory, the backward its inputs into a ring in
dynamic shared memory. Blocks never wait on each other.
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
from rnncc.variants.block_ffma import STATIC_SMEM_BYTES
from rnncc.variants.costs import block_tier_cost, mma_us

if TYPE_CHECKING:
    from rnncc.codegen.source import GeneratedSource
    from rnncc.ir.cell import BackwardCell, Cell
    from rnncc.tiling.hardware import HardwareCaps
    from rnncc.tiling.problem import Problem

#: R's fragments take at most this many registers per thread: with the cell's, more spill.
FRAGMENT_REGISTERS = 32
#: At most this many warps (8 units each): past 16 a thread's 64 registers no longer hold
#: the cell without spills.
MAX_WARPS = 16
#: Steps of W x copied ahead (forward) and of the backward's inputs (backward).
WX_AHEAD = 3
IN_AHEAD = 2
BACKWARD_FACTOR = 2.8


def k_tiles(p: Problem) -> int:
    return cdiv(p.head_dim, 16)


def warps(p: Problem) -> int:
    return cdiv(p.head_dim, 8)


def fragment_registers(p: Problem) -> int:
    """R as fragments: the forward's A (gate pairs × k tiles × 4) or the backward's B (gate
    rows / 16 × 2), whichever takes more registers per thread."""
    gr, kt = p.gates_r, k_tiles(p)
    return max(cdiv(gr, 2) * kt * 4, gr * kt * 2)


def _padded_row(nbytes: int, mod: int) -> int:
    """A row padded to ``mod`` bytes past a multiple of 128 (the rows a warp reads at once
    fall in different banks)."""
    return nbytes + (mod + 128 - nbytes % 128) % 128


def wx_row(p: Problem) -> int:
    """A batch row of a step's W x (or its cotangents) in shared memory, 16-bit."""
    return _padded_row(max(p.gates_x, 1) * p.head_dim * 2, 16)


def forward_smem(p: Problem) -> int:
    """h, double-buffered, and the ring of W x slots."""
    h = 2 * BATCH_CHUNK * (k_tiles(p) * 16 + 8) * 2
    return h + ((WX_AHEAD + 1) * BATCH_CHUNK * wx_row(p) if p.gates_x else 16)


def backward_static_smem(p: Problem) -> int:
    """dg and dW x, double-buffered; the biases and params, float."""
    kp = k_tiles(p) * 16
    static = 2 * BATCH_CHUNK * (max(p.gates_r, 1) * kp + 8) * 2
    static += 2 * BATCH_CHUNK * wx_row(p) if p.gates_x else 2 * 16
    return static + (max(p.gates_b, 1) + max(p.n_params, 1)) * kp * 4


def input_ring(p: Problem) -> dict[str, int]:
    """The backward's ring of step inputs: per slot the saved states and R·h (float rows),
    W x and dy (16-bit rows), 8 batch rows each; offsets in bytes."""
    f32, f16 = _padded_row(p.head_dim * 4, 32), _padded_row(p.head_dim * 2, 16)
    off_r = p.n_states * BATCH_CHUNK * f32
    off_x = off_r + p.gates_r * BATCH_CHUNK * f32
    off_y = off_x + p.gates_x * BATCH_CHUNK * f16
    slot = off_y + p.n_outputs * BATCH_CHUNK * f16 + 16  # + 16: a masked lane's pair read
    return {
        "row32": f32,
        "row16": f16,
        "off_r": off_r,
        "off_x": off_x,
        "off_y": off_y,
        "slot": slot,
        "bytes": (IN_AHEAD + 1) * slot,
    }


def warps_fit(p: Problem, caps: HardwareCaps) -> bool:
    return warps(p) <= MAX_WARPS


def fragments_fit_registers(p: Problem, caps: HardwareCaps) -> bool:
    return fragment_registers(p) <= FRAGMENT_REGISTERS


def forward_fits_shared_memory(p: Problem, caps: HardwareCaps) -> bool:
    return forward_smem(p) <= STATIC_SMEM_BYTES


def backward_fits_static_shared_memory(p: Problem, caps: HardwareCaps) -> bool:
    return backward_static_smem(p) <= STATIC_SMEM_BYTES


def backward_fits_shared_memory(p: Problem, caps: HardwareCaps) -> bool:
    return backward_static_smem(p) + input_ring(p)["bytes"] <= caps.smem_per_block_optin


class BlockMma(Variant):
    name = "block_mma"
    summary = "mma.sync block tier: one block per (head, 8 batch rows), R as fragments in registers"
    dtypes = ("fp16", "bf16")
    host = "fused"
    constraints = (
        Constraint(
            "block_warps",
            f"one warp per 8 units, at most {MAX_WARPS} warps",
            warps_fit,
            usage=lambda p, caps, pt: (warps(p), MAX_WARPS),
        ),
        Constraint(
            "r_fragments_fit_registers",
            f"R as mma fragments takes at most {FRAGMENT_REGISTERS} registers per thread",
            fragments_fit_registers,
            usage=lambda p, caps, pt: (fragment_registers(p), FRAGMENT_REGISTERS),
        ),
        Constraint(
            "forward_fits_shared_memory",
            f"h and {WX_AHEAD + 1} steps of W x fit {STATIC_SMEM_BYTES // 1024} KiB of static "
            "shared memory",
            forward_fits_shared_memory,
            usage=lambda p, caps, pt: (forward_smem(p), STATIC_SMEM_BYTES),
        ),
        Constraint(
            "backward_fits_static_shared_memory",
            "the backward's dg and dW x (double-buffered), biases and params fit "
            f"{STATIC_SMEM_BYTES // 1024} KiB of static shared memory",
            backward_fits_static_shared_memory,
            usage=lambda p, caps, pt: (backward_static_smem(p), STATIC_SMEM_BYTES),
        ),
        Constraint(
            "backward_fits_shared_memory",
            f"those and {IN_AHEAD + 1} steps of the backward's inputs fit a block's opt-in "
            "shared memory",
            backward_fits_shared_memory,
            usage=lambda p, caps, pt: (
                backward_static_smem(p) + input_ring(p)["bytes"],
                caps.smem_per_block_optin,
            ),
        ),
    )

    def build(self, problem: Problem, caps: HardwareCaps | None = None) -> dict[str, Any]:
        return {
            "variant": self.name,
            "D": problem.head_dim,
            "batch_chunk": BATCH_CHUNK,
            "warps": warps(problem),
            "threads": 32 * warps(problem),
            "wx_ahead": WX_AHEAD,
            "in_ahead": IN_AHEAD,
            "wx_row": wx_row(problem),
            "ring": input_ring(problem),
            **timeline_record(problem),
        }

    def launch(self, problem: Problem, caps: HardwareCaps, point: Point) -> Launch:
        grid = (problem.heads, cdiv(problem.batch, BATCH_CHUNK), 1)
        t = 32 * warps(problem)
        return Launch(
            KernelLaunch(0, t, 0, grid), KernelLaunch(0, t, input_ring(problem)["bytes"], grid)
        )

    def cost(self, problem: Problem, caps: HardwareCaps, point: Point) -> Cost:
        p = problem
        fmas = cdiv(p.gates_r, 2) * 2 * 8 * warps(p) * k_tiles(p) * 16 * BATCH_CHUNK
        return block_tier_cost(p, caps, mma_us(fmas, caps), BACKWARD_FACTOR)

    def render(self, cell: Cell, bwd: BackwardCell, build: Any) -> GeneratedSource:
        from rnncc.codegen.source import render_fused

        ring = build["ring"]
        traits = [
            ("int", "kD", build["D"]),
            ("int", "kBC", build["batch_chunk"]),
            ("int", "kWarps", build["warps"]),
            ("int", "kMmaThreads", build["threads"]),
            ("int", "kWxAhead", build["wx_ahead"]),
            ("int", "kInAhead", build["in_ahead"]),
            ("int", "kWxRow", build["wx_row"]),
            ("int", "kInS", ring["row32"]),
            ("int", "kInR", ring["row32"]),
            ("int", "kInX", ring["row16"]),
            ("int", "kInY", ring["row16"]),
            ("int", "kInOffR", ring["off_r"]),
            ("int", "kInOffX", ring["off_x"]),
            ("int", "kInOffY", ring["off_y"]),
            ("int", "kInSlot", ring["slot"]),
            ("size_t", "kBwSmem", ring["bytes"]),
        ]
        return render_fused(cell, bwd, self.name, build, traits, fast=True)
