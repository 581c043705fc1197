"""Shared fixtures of the tiling tests: problems of the example cells and the H100 caps.

Problems come from the examples through the front end (``Problem.from_cell``), so the plans
tested here are those of the cells users compile.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import pytest
from plan_table import EXAMPLES

from rnncc.frontend import compile_source, read_source
from rnncc.ir.cell import Cell
from rnncc.tiling import HardwareCaps, Problem, caps_for_arch


@cache
def example_cell(name: str) -> Cell:
    path = EXAMPLES / f"{name}.rnn"
    cells, _ = compile_source(read_source(path), str(path))
    return cells[0]


def make_problem(
    cell: str, heads: int, head_dim: int, batch: int = 16, dtype: str = "bf16"
) -> Problem:
    return Problem.from_cell(
        example_cell(cell), heads=heads, head_dim=head_dim, batch=batch, dtype=dtype
    )


@pytest.fixture(scope="session")
def problem() -> Callable[..., Problem]:
    """``problem(cell, heads, head_dim, batch=16, dtype="bf16")``: the problem of
    ``examples/<cell>.rnn`` at those sizes."""
    return make_problem


@pytest.fixture(scope="session")
def h100() -> HardwareCaps:
    return caps_for_arch("h100")
