"""``rnncc.RNN``: parameters, output layouts, options, errors and gradients."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import rnncc

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
IN, H, NH, B, T = 5, 6, 2, 3, 4


def layer(name: str, **kwargs) -> rnncc.RNN:
    torch.manual_seed(0)
    return rnncc.RNN(rnncc.load(EXAMPLES / f"{name}.rnn"), IN, H, **kwargs)


def param_shapes(module: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {n: tuple(p.shape) for n, p in module.named_parameters()}


def test_lstm_parameters() -> None:
    assert param_shapes(layer("lstm", num_heads=NH)) == {
        "input_proj.weight": (4 * H, IN),
        "input_proj.bias": (4 * H,),
        "R": (4, NH, 3, 3),
        "b": (4, NH, 3),
    }


def test_gru_parameters() -> None:
    m = layer("gru")
    assert param_shapes(m) == {
        "input_proj.weight": (3 * H, IN),
        "input_proj.bias": (3 * H,),
        "R": (3, 1, H, H),
        "b": (3, 1, H),
    }
    assert m.params is None


def test_parameters_of_a_cell_with_params() -> None:
    m = layer("peephole_lstm", num_heads=NH)
    assert param_shapes(m) == {
        "input_proj.weight": (4 * H, IN),
        "input_proj.bias": (4 * H,),
        "R": (4, NH, 3, 3),
        "b": (4, NH, 3),
        "params": (3, NH, 3),
    }
    assert m.output_size == 2 * H  # output h, c


def test_parameters_of_cells_without_r() -> None:
    m = layer("indrnn", num_heads=NH)
    assert m.R is None
    assert param_shapes(m) == {
        "input_proj.weight": (H, IN),
        "input_proj.bias": (H,),
        "b": (1, NH, 3),
        "params": (1, NH, 3),
    }
    lru = layer("lru")  # no R, no b
    assert lru.R is None and lru.b is None
    assert set(param_shapes(lru)) == {"input_proj.weight", "input_proj.bias", "params"}


def test_initialisation() -> None:
    m = layer("peephole_lstm")
    k = 1 / math.sqrt(H)
    for name in ("input_proj.weight", "input_proj.bias", "R", "b"):
        p = m.get_parameter(name)
        assert p.abs().max() <= k and p.std() > k / 4, name
    assert torch.equal(m.params, torch.zeros(3, 1, H))


def test_params_start_at_declared_values() -> None:
    assert torch.equal(layer("indrnn", num_heads=NH).params, torch.full((1, NH, 3), 0.5))
    assert torch.equal(layer("lru").params, torch.full((1, 1, H), -3.0))
    m = layer("indrnn")
    with torch.no_grad():
        m.params.zero_()
    m.reset_parameters()
    assert torch.equal(m.params, torch.full((1, 1, H), 0.5))


@pytest.mark.parametrize("name", ["lstm", "gru", "peephole_lstm", "slstm", "indrnn", "sru"])
def test_output_shapes(name: str) -> None:
    m = layer(name, num_heads=NH)
    cell = m.cell
    out, last = m(torch.randn(B, T, IN))
    assert out.shape == (B, T, len(cell.outputs) * H)
    assert last.shape == (len(cell.state_names), B, H)


def test_outputs_are_the_cell_outputs_concatenated() -> None:
    m = layer("peephole_lstm", num_heads=NH)
    x = torch.randn(B, T, IN)
    out, last = m(x)
    Wx = m.input_proj(x).view(B, T, 4, NH, H // NH)
    y, last_cell = m.cell(Wx, m.R, m.b, None, m.params)
    torch.testing.assert_close(out[..., :H], y[0].reshape(B, T, H))  # h
    torch.testing.assert_close(out[..., H:], y[1].reshape(B, T, H))  # c
    torch.testing.assert_close(last, last_cell.reshape(2, B, H))
    torch.testing.assert_close(out[:, -1], last.permute(1, 0, 2).reshape(B, 2 * H))


def test_batch_first_false() -> None:
    first = layer("lstm", num_heads=NH)
    second = layer("lstm", num_heads=NH, batch_first=False)
    second.load_state_dict(first.state_dict())
    x = torch.randn(B, T, IN)
    out1, last1 = first(x)
    out2, last2 = second(x.transpose(0, 1))
    assert out2.shape == (T, B, H) and last2.shape == (2, B, H)
    torch.testing.assert_close(out2, out1.transpose(0, 1))
    torch.testing.assert_close(last2, last1)


def test_bias_false() -> None:
    m = layer("lstm", bias=False)
    assert param_shapes(m) == {"input_proj.weight": (4 * H, IN), "R": (4, 1, H, H)}
    assert m.b is None
    out, _ = m(torch.zeros(B, T, IN))
    assert torch.equal(out, torch.zeros(B, T, H))  # no bias anywhere: zero in, zero out
    assert m.state_dict().keys() == {"input_proj.weight", "R"}


def test_num_heads_must_divide_hidden_size() -> None:
    with pytest.raises(ValueError, match=r"^hidden_size=6 is not divisible by num_heads=4$"):
        rnncc.RNN(rnncc.load(EXAMPLES / "lstm.rnn"), IN, 6, num_heads=4)


def test_wrong_x_shape() -> None:
    m = layer("gru")
    with pytest.raises(ValueError) as err:
        m(torch.randn(B, T, IN + 1))
    assert str(err.value) == "x has shape [3, 4, 6], expected [B, T, input_size] with input_size=5"
    with pytest.raises(ValueError) as err:
        m(torch.randn(B, IN))
    assert str(err.value) == "x has shape [3, 5], expected [B, T, input_size] with input_size=5"
    with pytest.raises(ValueError) as err:
        layer("gru", batch_first=False)(torch.randn(T, B, 2))
    assert str(err.value) == "x has shape [4, 3, 2], expected [T, B, input_size] with input_size=5"


def test_initial_states() -> None:
    m = layer("lstm", num_heads=NH)
    x = torch.randn(B, T, IN)
    zeros = torch.zeros(2, B, H)
    torch.testing.assert_close(m(x, zeros), m(x))
    states = torch.randn(2, B, H)
    out, last = m(x, states)
    assert not torch.allclose(out, m(x)[0])
    # the states are split into heads like the hidden units
    Wx = m.input_proj(x).view(B, T, 4, NH, H // NH)
    y, last_cell = m.cell(Wx, m.R, m.b, states.view(2, B, NH, H // NH))
    torch.testing.assert_close(out, y[0].reshape(B, T, H))
    torch.testing.assert_close(last, last_cell.reshape(2, B, H))
    # a sequence run in two halves equals the whole
    out1, mid = m(x[:, :2])
    out2, last2 = m(x[:, 2:], mid)
    torch.testing.assert_close(torch.cat([out1, out2], 1), m(x)[0])
    torch.testing.assert_close(last2, m(x)[1])


def test_wrong_states_shape() -> None:
    m = layer("lstm")
    with pytest.raises(ValueError) as err:
        m(torch.randn(B, T, IN), torch.zeros(1, B, H))
    assert str(err.value) == "states has shape [1, 3, 6], expected [S=2, B=3, hidden_size=6]"


@pytest.mark.parametrize("name", ["lstm", "gru", "peephole_lstm", "indrnn", "lru", "sru"])
def test_backward_reaches_every_parameter(name: str) -> None:
    m = layer(name, num_heads=NH)
    x = torch.randn(B, T, IN, requires_grad=True)
    states = torch.randn(len(m.cell.state_names), B, H, requires_grad=True)
    out, last = m(x, states)
    (out.square().sum() + last.square().sum()).backward()
    for pname, p in m.named_parameters():
        assert p.grad is not None, pname
        assert p.grad.abs().sum() > 0, pname
    assert x.grad is not None and states.grad is not None


def test_float64_module() -> None:
    m = rnncc.RNN(EXAMPLES / "slstm.rnn", IN, H, dtype=torch.float64)
    out, last = m(torch.randn(B, T, IN, dtype=torch.float64))
    assert out.dtype == last.dtype == torch.float64


def test_constructing_from_a_path() -> None:
    for path in (str(EXAMPLES / "gru.rnn"), EXAMPLES / "gru.rnn"):
        m = rnncc.RNN(path, IN, H)
        assert isinstance(m.cell, rnncc.CompiledCell) and m.cell.name == "gru"
        assert m(torch.randn(B, T, IN))[0].shape == (B, T, H)
    assert "cell=gru, input_size=5, hidden_size=6, num_heads=1" in repr(m)


def test_a_module_survives_checkpointing(tmp_path) -> None:
    """Training scripts save whole models, deep-copy them (weight averaging) and pickle them
    into worker processes: each copy gives the original's results."""
    import copy
    import pickle

    m = layer("slstm", num_heads=NH)
    x = torch.randn(B, T, IN)
    out, last = m(x)
    torch.save(m, tmp_path / "m.pt")
    copies = [
        torch.load(tmp_path / "m.pt", weights_only=False),
        pickle.loads(pickle.dumps(m)),
        copy.deepcopy(m),
        torch.optim.swa_utils.AveragedModel(m).module,
    ]
    for c in copies:
        assert c is not m and c.cell.name == "slstm"
        out2, last2 = c(x)
        assert torch.equal(out, out2) and torch.equal(last, last2)
