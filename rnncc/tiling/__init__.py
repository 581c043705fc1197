"""Tiling: problem and hardware caps → the feasible tiling plans, ranked by a cost model.

``hardware`` (caps of a device or a named GPU), ``problem`` (sizes and the cell's pointwise
cost), ``model`` (variables, domains, named constraints, the layout a point implies), ``cost``
(µs per step), ``plan`` (``TilingPlan`` and ``explain``), ``solve`` (python-constraint2,
ranking, diagnosis of infeasible problems), ``command`` (the ``rnncc plan`` subcommand).
Nothing touches a GPU or parses a cell at import time.
"""

from rnncc.errors import TilingError
from rnncc.tiling.cost import Cost
from rnncc.tiling.hardware import HardwareCaps, caps_for_arch, caps_for_device
from rnncc.tiling.model import Model, Point
from rnncc.tiling.plan import TilingPlan
from rnncc.tiling.problem import Problem
from rnncc.tiling.solve import check_plan, feasible_plans, solve

__all__ = [
    "Cost",
    "HardwareCaps",
    "Model",
    "Point",
    "Problem",
    "TilingError",
    "TilingPlan",
    "caps_for_arch",
    "caps_for_device",
    "check_plan",
    "feasible_plans",
    "solve",
]
