"""Tiling: a problem and the device's caps → the plan of the kernel variant that runs it.

``problem`` (sizes, storage dtype, the cell's counts and pointwise cost), ``hardware`` (caps
of a device or a named GPU), ``solve`` (each variant's points through python-constraint2,
ranked by the variants' cost models; diagnosis of infeasible problems) and ``plan`` (``Plan``,
``explain``). The variants themselves live in ``rnncc.variants``. Nothing touches a GPU or
parses a cell at import time.
"""

from rnncc.errors import TilingError
from rnncc.tiling.hardware import HardwareCaps, caps_for_arch, caps_for_device
from rnncc.tiling.plan import Alternative, Plan
from rnncc.tiling.problem import Problem
from rnncc.tiling.solve import feasible_plans, solve

__all__ = [
    "Alternative",
    "HardwareCaps",
    "Plan",
    "Problem",
    "TilingError",
    "caps_for_arch",
    "caps_for_device",
    "feasible_plans",
    "solve",
]
