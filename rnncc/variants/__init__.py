"""The kernel variants that exist, in one registry: the solver's only choices.

Each module declares one variant (``base.Variant``): its parameters and their domains, its
named constraints and cost terms, its launch metadata and its render step. Adding a kernel is
adding a module here and its templates.
"""

from rnncc.variants.base import Constraint, Cost, KernelLaunch, Launch, Variant
from rnncc.variants.block_ffma import BlockFfma
from rnncc.variants.block_mma import BlockMma
from rnncc.variants.grid_mma import GridMma
from rnncc.variants.grid_sparse import GridSparse
from rnncc.variants.grid_stream import GridStream
from rnncc.variants.stepwise import Stepwise

#: Every variant, fused ones first (the order breaks cost ties).
VARIANTS: tuple[Variant, ...] = (
    BlockFfma(),
    BlockMma(),
    GridMma(),
    GridStream(),
    GridSparse(),
    Stepwise(),
)
#: The variants by name.
BY_NAME: dict[str, Variant] = {v.name: v for v in VARIANTS}

__all__ = ["BY_NAME", "VARIANTS", "Constraint", "Cost", "KernelLaunch", "Launch", "Variant"]
