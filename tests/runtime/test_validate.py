"""Input checks of a cell call: every ``ValueError`` of ``validate``, each naming the tensor,
what was expected and what was given (shape, dtype, device or type)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import rnncc
from rnncc.runtime.validate import Sizes, validate

REPO = Path(__file__).resolve().parents[2]
B, T, NH, D = 2, 3, 2, 3


def load(name: str):
    return rnncc.load(REPO / "examples" / f"{name}.rnn")


def tensors(name: str, dtype=torch.float32) -> dict[str, torch.Tensor | None]:
    """Valid inputs for every argument of the example cell ``name`` (None where not taken)."""
    shapes = load(name).shapes(B, T, NH, D)
    return {
        k: None if shapes[k] is None else torch.randn(shapes[k], dtype=dtype)
        for k in ("Wx", "R", "b", "states", "params")
    }


def check(name: str, message: str, **changes) -> None:
    """``validate`` of the example ``name`` with ``changes`` raises ``message`` exactly."""
    cell = load(name)
    args = tensors(name) | changes
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        validate(cell.ir, **args)
    # and the cell's call reports the same
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        cell(**args)


@pytest.mark.parametrize("name", ["lstm", "gru", "indrnn", "mingru", "lru", "sru", "peephole_lstm"])
def test_valid_inputs(name: str) -> None:
    cell = load(name)
    assert validate(cell.ir, **tensors(name)) == Sizes(B, T, NH, D)
    y, last = cell(**tensors(name))
    assert tuple(y.shape) == cell.shapes(B, T, NH, D)["y"]
    assert tuple(last.shape) == cell.shapes(B, T, NH, D)["last"]


def test_states_and_params_may_be_none() -> None:
    args = tensors("peephole_lstm") | {"states": None, "params": None}
    assert validate(load("peephole_lstm").ir, **args) == Sizes(B, T, NH, D)


# ---- Wx ----------------------------------------------------------------------------------


def test_wx_wrong_rank() -> None:
    check(
        "lstm",
        "Wx has shape [2, 3, 4, 6], expected [B, T, Gx=4, NH, D] "
        "(the W x gates of cell 'lstm': i, f, z, o)",
        Wx=torch.randn(2, 3, 4, 6),
    )


def test_wx_wrong_gate_count() -> None:
    check(
        "gru",
        "Wx has shape [2, 3, 4, 2, 3], expected [B, T, Gx=3, NH, D] "
        "(the W x gates of cell 'gru': xr, xz, xn)",
        Wx=torch.randn(2, 3, 4, 2, 3),
    )


def test_wx_not_a_tensor() -> None:
    check(
        "lstm",
        "Wx must be a torch.Tensor of shape [B, T, Gx=4, NH, D], got list",
        Wx=[[1.0, 2.0]],
    )


def test_wx_unsupported_dtype() -> None:
    args = tensors("lstm")
    check(
        "lstm",
        "Wx has dtype torch.int64; supported: float32, float16, bfloat16, float64",
        **{k: v.long() for k, v in args.items() if v is not None},
    )


# ---- R -----------------------------------------------------------------------------------


def test_missing_r() -> None:
    check(
        "lstm",
        "cell 'lstm' has R terms (gates i, f, z, o): R of shape [Gr=4, NH=2, D=3, D=3] is required",
        R=None,
    )


@pytest.mark.parametrize("name", ["indrnn", "mingru"])
def test_r_for_a_cell_without_r(name: str) -> None:
    check(
        name,
        f"cell '{name}' has no 'R h' term: pass R=None, not a tensor of shape [1, 2, 3, 3]",
        R=torch.randn(1, NH, D, D),
    )


def test_r_wrong_shape() -> None:
    check(
        "lstm",
        "R has shape [4, 2, 3, 4], expected [4, 2, 3, 3] (Gr=4, NH, D out, D in)",
        R=torch.randn(4, 2, 3, 4),
    )
    check(
        "gru",
        "R has shape [4, 2, 3, 3], expected [3, 2, 3, 3] (Gr=3, NH, D out, D in)",
        R=torch.randn(4, 2, 3, 3),
    )


def test_r_not_a_tensor() -> None:
    check(
        "lstm",
        "R must be a torch.Tensor of shape [4, 2, 3, 3] (Gr=4, NH, D out, D in), got float",
        R=1.0,
    )


# ---- b -----------------------------------------------------------------------------------


def test_missing_b() -> None:
    check(
        "lstm",
        "cell 'lstm' has bias terms (gates i, f, z, o): b of shape [Gb=4, NH=2, D=3] is required",
        b=None,
    )


def test_b_for_a_cell_without_b() -> None:
    check(
        "lru",
        "cell 'lru' has no 'b' term: pass b=None, not a tensor of shape [1, 2, 3]",
        b=torch.randn(1, NH, D),
    )


def test_b_wrong_shape() -> None:
    # mgu: b rides with the W x gates xf, xn
    check("mgu", "b has shape [3, 2, 3], expected [2, 2, 3] (Gb=2, NH, D)", b=torch.randn(3, NH, D))


# ---- states ------------------------------------------------------------------------------


def test_states_wrong_shape() -> None:
    check(
        "lstm",
        "states has shape [2, 3, 2, 3], expected [2, 2, 2, 3] (S=2 states h, c, B, NH, D)",
        states=torch.randn(2, 3, NH, D),
    )
    check(
        "slstm",
        "states has shape [2, 2, 2, 3], expected [4, 2, 2, 3] (S=4 states h, c, n, m, B, NH, D)",
        states=torch.randn(2, B, NH, D),
    )


# ---- params ------------------------------------------------------------------------------


def test_params_for_a_cell_without_params() -> None:
    check(
        "mingru",
        "cell 'mingru' has no params: pass params=None, not a tensor of shape [1, 2, 3]",
        params=torch.randn(1, NH, D),
    )


def test_params_wrong_shape() -> None:
    check(
        "indrnn",
        "params has shape [2, 2, 3], expected [1, 2, 3] (P=1 params u, NH, D)",
        params=torch.randn(2, NH, D),
    )
    check(
        "peephole_lstm",
        "params has shape [3, 2, 4], expected [3, 2, 3] (P=3 params p_i, p_f, p_o, NH, D)",
        params=torch.randn(3, NH, 4),
    )


# ---- dtype and device --------------------------------------------------------------------


@pytest.mark.parametrize("which", ["R", "b", "states", "params"])
def test_dtype_mismatch(which: str) -> None:
    args = tensors("peephole_lstm")
    check(
        "peephole_lstm",
        f"{which} has dtype torch.float64, expected torch.float32 like Wx",
        **{which: args[which].double()},
    )


def test_dtype_mismatch_half() -> None:
    args = tensors("lstm", dtype=torch.bfloat16)
    check(
        "lstm",
        "b has dtype torch.float16, expected torch.bfloat16 like Wx",
        **(args | {"b": args["b"].half()}),
    )


def test_device_mismatch() -> None:
    # the meta device stands in for a GPU on a CPU-only machine
    check(
        "lstm",
        "states is on meta, expected cpu like Wx",
        states=torch.empty(2, B, NH, D, device="meta"),
    )


# ---- the check of every call and its messages --------------------------------------------


@pytest.mark.parametrize(
    ("given", "fits"),
    [
        (torch.randn(4, NH, D), True),
        (torch.randn(4, NH, D, 2)[..., 0], True),  # a strided view: contiguity is not checked
        (torch.randn(4, NH, D + 1), False),
        (torch.randn(4, NH, D, dtype=torch.float64), False),
        (torch.empty(4, NH, D, device="meta"), False),
        ([1.0], False),
    ],
    ids=["fits", "view", "shape", "dtype", "device", "list"],
)
def test_the_quiet_check_and_the_messages_agree(given: object, fits: bool) -> None:
    # A call checks with _fits, which builds no message; _reject builds it, and raises a
    # ValueError exactly when _fits is false.
    from rnncc.runtime.validate import _fits, _reject

    like = torch.randn(1)
    assert _fits(given, (4, NH, D), like) is fits
    with pytest.raises(AssertionError if fits else ValueError):
        _reject("b", given, (4, NH, D), "Gb=4, NH, D", like)


@pytest.mark.parametrize(
    ("lengths", "message"),
    [
        ([2, 3], "lengths must be a torch.Tensor [B=2] integers in 1..T=3, got list"),
        (
            torch.tensor([2.0, 3.0]),
            "lengths has dtype torch.float32, expected an integer dtype [B=2] integers in 1..T=3",
        ),
        (
            torch.tensor([1, 2, 3]),
            "lengths has shape [3] (dtype torch.int64, on cpu), expected [B=2] integers in 1..T=3",
        ),
        (
            torch.tensor([3, 0], dtype=torch.int32),
            "lengths[1] = 0 (dtype torch.int32, on cpu) is outside 1..T=3: every row runs at "
            "least one and at most T steps",
        ),
        (
            torch.tensor([4, 1]),
            "lengths[0] = 4 (dtype torch.int64, on cpu) is outside 1..T=3: every row runs at "
            "least one and at most T steps",
        ),
    ],
)
def test_lengths(lengths, message) -> None:
    cell = load("lstm")
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        cell(**tensors("lstm"), lengths=lengths)


@pytest.mark.parametrize(
    "reverse, message",
    [
        (1, "reverse must be True, False or one bool per head; got 1"),
        ([1], "reverse must be True, False or one bool per head; got [1]"),
        ([False, True, True], "reverse has 3 bools, expected one per head (NH=2)"),
    ],
)
def test_reverse_is_a_bool_or_one_per_head(reverse, message) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        load("lstm")(**tensors("lstm"), reverse=reverse)


def test_reverse_per_head_reverses_the_last_heads() -> None:
    from rnncc.runtime.validate import validate_reverse

    assert [validate_reverse(r, 3) for r in (False, True, [False, True, True])] == [3, 0, 1]
    assert validate_reverse((False, False, False), 3) == 3
    with pytest.raises(ValueError, match=re.escape("reverse=[True, False] reverses heads that")):
        validate_reverse([True, False], 2)
