"""Shared fixtures of the tiling tests: example cells' pointwise costs and the H100 caps.

The cells' numbers are what ``Problem.from_cell`` derives from ``rnncc.ir.op_counts`` of the
DESIGN.md examples; they are fixed here so that these tests do not depend on the front end.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rnncc.tiling import HardwareCaps, Problem, caps_for_arch

LSTM: dict[str, Any] = dict(gates_r=4, n_states=2, mufu_ops=8, alu_ops=10, cell_regs=7)
GRU: dict[str, Any] = dict(gates_r=3, n_states=1, mufu_ops=5, alu_ops=12, cell_regs=7)
SLSTM: dict[str, Any] = dict(gates_r=4, n_states=4, mufu_ops=8, alu_ops=23, cell_regs=10)


def make_lstm(heads: int, head_dim: int, batch: int = 16, dtype: str = "bf16") -> Problem:
    return Problem(heads=heads, head_dim=head_dim, batch=batch, dtype=dtype, **LSTM)


@pytest.fixture(scope="session")
def lstm() -> Callable[..., Problem]:
    """``lstm(heads, head_dim, batch=16, dtype="bf16")``: an LSTM problem."""
    return make_lstm


@pytest.fixture(scope="session")
def h100() -> HardwareCaps:
    return caps_for_arch("sm_90")
