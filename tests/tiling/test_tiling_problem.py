"""Problem: sizes, validation, and the cell's counts and pointwise cost read through the IR."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

from rnncc.ir.ops import OPS
from rnncc.tiling import Problem
from rnncc.tiling.problem import estimate_cell_regs, pointwise_mix

LSTM_COUNTS = {"gate": 4, "sigmoid": 3, "state": 1, "mul": 3, "tanh": 2, "add": 1}


class StandInCell:
    """Only the attributes ``Problem.from_cell`` may read; anything else fails the test."""

    def __init__(
        self,
        gr_names: tuple[str, ...],
        states: tuple[str, ...],
        gx_names: tuple[str, ...] | None = None,
        gb_names: tuple[str, ...] | None = None,
        params: tuple[str, ...] = (),
        outputs: tuple[str, ...] = ("h",),
    ):
        self._attrs = {
            "gr_names": gr_names,
            "gx_names": gr_names if gx_names is None else gx_names,
            "gb_names": gr_names if gb_names is None else gb_names,
            "states": tuple(type("State", (), {"name": s})() for s in states),
            "params": params,
            "outputs": outputs,
        }

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_attrs"][name]
        except KeyError:
            raise AssertionError(f"Problem.from_cell read cell.{name}") from None


def test_lstm_mix_counts_special_functions_at_their_mufu_cost() -> None:
    # sigmoid = ex2 + rcp, tanh = MUFU.TANH: 3 × 2 + 2 × 1
    mufu, alu = pointwise_mix(LSTM_COUNTS)
    assert mufu == 8
    assert alu == 3 * 2 + 3 + 1  # sigmoid's negate-and-add, the multiplies, the add


def test_the_op_table_holds_each_ops_instruction_mix() -> None:
    assert OPS["logsigmoid"].mufu == OPS["softplus"].mufu == 2  # ex2 + lg2
    assert (OPS["div"].mufu, OPS["div"].alu) == (1, 3)  # rcp and a Newton step
    assert (OPS["tanh"].mufu, OPS["tanh"].alu) == (1, 0)  # MUFU.TANH
    free = ("const", "state", "gate", "param", "dstate", "dout", "detach")
    assert all((OPS[op].mufu, OPS[op].alu) == (0, 0) for op in free)


def test_from_cell_with_given_counts() -> None:
    cell = StandInCell(("i", "f", "z", "o"), ("h", "c"))
    p = Problem.from_cell(cell, heads=12, head_dim=64, batch=16, op_counts=LSTM_COUNTS)
    assert (p.gates_r, p.gates_x, p.gates_b, p.n_states, p.n_params, p.n_outputs) == (
        4,
        4,
        4,
        2,
        0,
        1,
    )
    assert (p.mufu_ops, p.alu_ops) == (8, 10)
    assert p.cell_regs == estimate_cell_regs(LSTM_COUNTS)
    assert (p.heads, p.head_dim, p.batch, p.dtype) == (12, 64, 16, "bf16")


def test_from_cell_reads_rnncc_ir_op_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    fake = ModuleType("rnncc.ir")

    def op_counts(cell: object) -> dict[str, int]:
        seen.append(cell)
        return {"gate": 3, "sigmoid": 2, "tanh": 1, "add": 4, "sub": 1, "mul": 3, "const": 1}

    fake.op_counts = op_counts  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "rnncc.ir", fake)
    cell = StandInCell(("hr", "hz", "hn"), ("h",))
    p = Problem.from_cell(cell, heads=1, head_dim=768, batch=8, dtype="fp16")
    assert seen == [cell]
    assert (p.gates_r, p.n_states, p.mufu_ops, p.dtype) == (3, 1, 5, "fp16")


def test_cell_without_recurrent_product() -> None:
    cell = StandInCell((), ("h",), gx_names=("x",), gb_names=(), params=("a",))
    p = Problem.from_cell(cell, heads=4, head_dim=32, batch=2, op_counts={"mul": 2, "relu": 1})
    assert p.gates_r == 0 and p.r_bytes_per_head == 0
    assert (p.gates_x, p.gates_b, p.n_params, p.gates_in) == (1, 0, 1, 1)


@pytest.mark.parametrize(
    ("cell", "counts"),
    [
        # (gates_r, gates_x, gates_b, states, params, outputs), read off each cell's declarations
        ("lstm", (4, 4, 4, 2, 0, 1)),
        ("gru", (3, 3, 3, 1, 0, 1)),
        ("slstm", (4, 4, 4, 4, 0, 1)),
        ("peephole_lstm", (4, 4, 4, 2, 3, 2)),
        ("indrnn", (0, 1, 1, 1, 1, 1)),
        ("lru", (0, 1, 0, 1, 1, 1)),
        ("sru", (0, 4, 2, 2, 2, 1)),
    ],
)
def test_counts_of_the_examples(
    cell: str, counts: tuple[int, ...], problem: Callable[..., Problem]
) -> None:
    p = problem(cell, 1, 64)
    assert (p.gates_r, p.gates_x, p.gates_b, p.n_states, p.n_params, p.n_outputs) == counts


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("heads", 0, "heads must be positive"),
        ("head_dim", -1, "head_dim must be positive"),
        ("batch", 0, "batch must be positive"),
        ("n_states", 0, "n_states must be positive"),
        ("gates_r", -1, "gates_r must not be negative"),
        ("n_params", -1, "n_params must not be negative"),
        ("dtype", "fp8", "dtype must be one of"),
    ],
)
def test_validation(field: str, value: object, message: str) -> None:
    kwargs: dict[str, Any] = dict(gates_r=4, heads=1, head_dim=64, batch=16)
    kwargs[field] = value
    with pytest.raises(ValueError, match=message):
        Problem(**kwargs)


def test_input_and_bias_gates_default_to_the_recurrent_ones() -> None:
    p = Problem(gates_r=3, heads=1, head_dim=64, batch=16)
    assert (p.gates_x, p.gates_b) == (3, 3)
    p = Problem(gates_r=3, heads=1, head_dim=64, batch=16, gates_x=1, gates_b=0)
    assert (p.gates_x, p.gates_b) == (1, 0)


def test_sizes() -> None:
    p = Problem(gates_r=4, heads=1, head_dim=768, batch=16)
    assert p.r_bytes_per_head == 4 * 768 * 768 * 2  # 4.7 MB
    assert Problem(gates_r=4, heads=1, head_dim=768, batch=16, dtype="fp32").dtype_bytes == 4
