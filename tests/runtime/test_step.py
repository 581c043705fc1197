"""Step mode on the reference backend, in float64: ``T`` calls of ``CompiledCell.step`` and of
``RNN.step`` equal one sequence call, outputs, states and gradients; bad input is a
``ValueError`` naming the argument."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import rnncc
from rnncc.testing import random_inputs

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.rnn"))
INPUTS = ("Wx", "R", "b", "states", "params")


def _leaves(x: dict) -> dict[str, torch.Tensor]:
    return {k: x[k].clone().requires_grad_() for k in INPUTS if x[k] is not None}


def _stepped(cell: rnncc.CompiledCell, x: dict[str, torch.Tensor]):
    """The sequence run as T steps: ``y`` ``[O, B, T, NH, D]`` and the last states."""
    states, ys = x.get("states"), []
    for t in range(x["Wx"].shape[1]):
        y_t, states = cell.step(
            x["Wx"][:, t], x.get("R"), x.get("b"), states, x.get("params"), backend="reference"
        )
        ys.append(y_t)
    return torch.stack(ys, dim=2), states


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_steps_equal_the_sequence_call_and_its_gradients(path: Path) -> None:
    cell = rnncc.load(path)
    x = random_inputs(cell.ir, 3, 5, 2, 4, seed=1)
    seq, steps = _leaves(x), _leaves(x)
    y, last = cell(*(seq.get(k) for k in INPUTS), backend="reference")
    y_s, last_s = _stepped(cell, steps)
    torch.testing.assert_close(y_s, y, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(last_s, last, rtol=1e-9, atol=1e-9)
    w_y, w_last = torch.randn_like(y), torch.randn_like(last)
    ((y * w_y).sum() + (last * w_last).sum()).backward()
    ((y_s * w_y).sum() + (last_s * w_last).sum()).backward()
    for k in seq:
        torch.testing.assert_close(steps[k].grad, seq[k].grad, rtol=1e-9, atol=1e-9, msg=k)


def test_first_step_starts_from_the_declared_states() -> None:
    cell = rnncc.load(EXAMPLES[0].parent / "lstm.rnn")
    x = random_inputs(cell.ir, 2, 1, 1, 3, seed=0)
    y_t, new = cell.step(x["Wx"][:, 0], x["R"], x["b"], backend="reference")
    y, last = cell(x["Wx"], x["R"], x["b"], backend="reference")
    torch.testing.assert_close(y_t, y[:, :, 0])
    torch.testing.assert_close(new, last)


def test_rows_of_the_state_can_be_reordered_between_steps() -> None:
    """Beam search: index_select on the batch axis of the state, then the next step."""
    cell = rnncc.load(EXAMPLES[0].parent / "gru.rnn")
    x = random_inputs(cell.ir, 3, 2, 1, 4, seed=2)
    _, s1 = cell.step(x["Wx"][:, 0], x["R"], x["b"], x["states"], backend="reference")
    order = torch.tensor([2, 0, 0])
    y2, _ = cell.step(x["Wx"][:, 1], x["R"], x["b"], s1.index_select(1, order), backend="reference")
    for row, src in enumerate(order.tolist()):
        y_ref, _ = cell.step(
            x["Wx"][row : row + 1, 1], x["R"], x["b"], s1[:, src : src + 1], backend="reference"
        )
        torch.testing.assert_close(y2[:, row : row + 1], y_ref)


def test_step_rejects_bad_input() -> None:
    cell = rnncc.load(EXAMPLES[0].parent / "lstm.rnn")
    x = random_inputs(cell.ir, 2, 1, 1, 3)
    with pytest.raises(ValueError, match=r"Wx_t has shape \[2, 1, 4, 1, 3\], expected \[B, Gx=4"):
        cell.step(x["Wx"], x["R"], x["b"])
    with pytest.raises(
        ValueError, match=r"Wx_t has shape \[2, 3, 1, 3\], expected \[B, Gx=4, NH, D\]"
    ):
        cell.step(x["Wx"][:, 0, :3], x["R"], x["b"])
    with pytest.raises(ValueError, match="states"):
        cell.step(x["Wx"][:, 0], x["R"], x["b"], x["states"][:, :1])
    with pytest.raises(ValueError, match="states"):
        cell.step(x["Wx"][:, 0], x["R"], x["b"], x["states"].float())


@pytest.mark.parametrize("batch_first", [True, False])
def test_layer_steps_equal_the_stack(batch_first: bool) -> None:
    torch.manual_seed(0)
    layer = rnncc.RNN(
        rnncc.load(EXAMPLES[0].parent / "lstm.rnn"), 3, 4, num_layers=2,
        batch_first=batch_first, dtype=torch.float64,
    )  # fmt: skip
    x = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(2, 2, 2, 4, dtype=torch.float64, requires_grad=True)
    out, last = layer(x if batch_first else x.transpose(0, 1), h0)
    out = out if batch_first else out.transpose(0, 1)
    states, outs = h0, []
    for t in range(5):
        o, states = layer.step(x[:, t], states)
        outs.append(o)
    torch.testing.assert_close(torch.stack(outs, 1), out, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(states, last, rtol=1e-9, atol=1e-9)
    g_seq = torch.autograd.grad((out.sum() + last.sum()), (x, h0))
    g_step = torch.autograd.grad((torch.stack(outs, 1).sum() + states.sum()), (x, h0))
    for a, b in zip(g_step, g_seq, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_layer_steps_of_one_sequence_equal_its_forward() -> None:
    """x_t [input_size] and states without a batch axis, as forward takes one sequence."""
    torch.manual_seed(0)
    layer = rnncc.RNN(
        rnncc.load(EXAMPLES[0].parent / "lstm.rnn"), 3, 4, num_layers=2, dtype=torch.float64
    )
    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(2, 2, 4, dtype=torch.float64, requires_grad=True)
    out, last = layer(x, h0)
    states, outs = (h0[0], h0[1]), []  # nn.LSTM's (h0, c0) for the first step
    for t in range(5):
        o, states = layer.step(x[t], states)
        assert o.shape == (4,) and states.shape == (2, 2, 4)
        outs.append(o)
    torch.testing.assert_close(torch.stack(outs), out, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(states, last, rtol=1e-9, atol=1e-9)
    g_seq = torch.autograd.grad((out.sum() + last.sum()), (x, h0))
    g_step = torch.autograd.grad((torch.stack(outs).sum() + states.sum()), (x, h0))
    for a, b in zip(g_step, g_seq, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
    with pytest.raises(ValueError, match=r"^states has shape \[2, 4\], expected \[S=2 "):
        layer.step(x[0], h0[0])


def test_layer_step_rejects_bidirectional_and_bad_input() -> None:
    cell = rnncc.load(EXAMPLES[0].parent / "lstm.rnn")
    with pytest.raises(ValueError, match="bidirectional"):
        rnncc.RNN(cell, 3, 4, bidirectional=True).step(torch.randn(2, 3))
    for shape in ((2, 1, 3), (4,)):
        with pytest.raises(ValueError) as err:
            rnncc.RNN(cell, 3, 4).step(torch.randn(shape))
        assert str(err.value) == (
            f"x_t has shape [{', '.join(map(str, shape))}], expected [B, input_size=3] or "
            "[input_size] (one sequence)"
        )
