"""Grid stream: the fused 16-bit kernels for heads whose R does not fit on chip.

The grid tier's kernels (``grid_mma``) on blocks of 32 units (``unit_tiles`` 4), one per SM:
each warp keeps the first k tiles of its part of R in registers, the next ones in shared
memory, and reads the rest from global memory every step (L2 where R fits it, else HBM), as
mma fragments a lane loads whole (the kernel writes them there before the sequence). h and dg
go through the exchange buffer as on ``grid_mma``; the streamed fragments follow its counters
in the same buffer. Planned only where R does not fit the blocks' registers and shared memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rnncc.variants.base import Constraint
from rnncc.variants.grid_mma import (
    STREAM_KERNELS,
    GridMma,
    backward_smem,
    batch_tiles_needed,
    blocks_per_head,
    forward_smem,
    head_blocks_co_resident,
    partial_sums_fit_shared_memory,
    r_tile_fits_registers,
    smem_limit,
    streams_what_the_chip_cannot_hold,
    wide_blocks_fit_registers,
)

if TYPE_CHECKING:
    from rnncc.tiling.hardware import HardwareCaps
    from rnncc.tiling.problem import Problem


class GridStream(GridMma):
    name = "grid_stream"
    summary = (
        "mma.sync grid tier for heads past the chip: blocks of 32 units stream the part of R "
        "their registers and shared memory do not hold from memory each step"
    )
    kernels = STREAM_KERNELS
    constraints = (
        Constraint(
            "r_tile_fits_registers",
            "one k tile of R (4 registers per gate pair) takes at most 64 registers",
            r_tile_fits_registers,
        ),
        Constraint(
            "streams_what_the_chip_cannot_hold",
            "only for heads whose R grid_mma's wide blocks do not hold on chip (more blocks "
            "than SMs, or their part of R past shared memory)",
            streams_what_the_chip_cannot_hold,
        ),
        Constraint(
            "built_for_hopper",
            "streaming blocks are built for Hopper (sm_90) only",
            wide_blocks_fit_registers,
            ("unit_tiles",),
        ),
        Constraint(
            "head_blocks_co_resident",
            "the blocks of one head (32 units each) are resident at once, one per SM",
            head_blocks_co_resident,
            ("unit_tiles", "blocks_per_sm"),
            usage=lambda p, caps, pt: (
                blocks_per_head(p, pt["unit_tiles"]),
                pt["blocks_per_sm"] * caps.sm_count,
            ),
        ),
        Constraint(
            "partial_sums_fit_shared_memory",
            "a block's partial products and the part of R it keeps there fit its opt-in "
            "shared memory",
            partial_sums_fit_shared_memory,
            ("n_tiles", "unit_tiles"),
            usage=lambda p, caps, pt: (
                max(
                    forward_smem(p, pt["n_tiles"], pt["unit_tiles"]),
                    backward_smem(p, pt["n_tiles"], pt["unit_tiles"]),
                ),
                smem_limit(caps),
            ),
        ),
        Constraint(
            "batch_tiles_needed",
            "a block takes more batch rows only when the batch has them",
            batch_tiles_needed,
            ("n_tiles",),
        ),
    )

    def domains(self, problem: Problem, caps: HardwareCaps) -> dict[str, tuple[Any, ...]]:
        return {
            "n_tiles": tuple(nt for nt, _ in STREAM_KERNELS),
            "unit_tiles": (4,),
            "blocks_per_sm": (1,),
        }
