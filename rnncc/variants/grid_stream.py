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
    BATCH_TILES,
    CO_RESIDENT,
    R_TILE,
    SHARED_MEMORY,
    STREAM_KERNELS,
    GridMma,
    built_for_hopper,
    streams_what_the_chip_cannot_hold,
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
    dtypes = ("fp16", "bf16")
    constraints = (
        R_TILE,
        Constraint(
            "streams_what_the_chip_cannot_hold",
            "only for heads whose R grid_mma's wide blocks do not hold on chip (more blocks "
            "than SMs, or their part of R past shared memory)",
            streams_what_the_chip_cannot_hold,
        ),
        Constraint(
            "built_for_hopper",
            "streaming blocks are built for Hopper (sm_90) only",
            built_for_hopper,
        ),
        CO_RESIDENT,
        SHARED_MEMORY,
        BATCH_TILES,
    )

    def domains(self, problem: Problem, caps: HardwareCaps) -> dict[str, tuple[Any, ...]]:
        return {
            "n_tiles": tuple(nt for nt, _ in STREAM_KERNELS),
            "unit_tiles": (4,),
            "blocks_per_sm": (1,),
        }
