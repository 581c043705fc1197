"""``rnncc.RNN``: parameters, output layouts, stacked and bidirectional layers, states, lengths
and packed input, dropout, autocast, options, errors and gradients. Equality with torch's
modules is tests/runtime/test_torch_compat.py's."""

from __future__ import annotations

import math
import re
import warnings
from pathlib import Path

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence

import rnncc
import rnncc.errors

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
IN, H, NH, B, T = 5, 6, 2, 3, 4


def layer(name: str, **kwargs) -> rnncc.RNN:
    torch.manual_seed(0)
    return rnncc.RNN(rnncc.load(EXAMPLES / f"{name}.rnn"), IN, H, **kwargs)


def param_shapes(module: torch.nn.Module, k: int = 0) -> dict[str, tuple[int, ...]]:
    """The parameters of ``module.weights[k]`` (one layer and direction), by name."""
    prefix = f"weights.{k}."
    return {
        n.removeprefix(prefix): tuple(p.shape)
        for n, p in module.named_parameters()
        if n.startswith(prefix)
    }


def test_lstm_parameters() -> None:
    assert param_shapes(layer("lstm", num_heads=NH)) == {
        "input_proj.weight": (4 * H, IN),
        "input_proj.bias": (4 * H,),
        "R": (4, NH, 3, 3),
        "b": (4, NH, 3),
    }


def test_gru_parameters() -> None:
    m = layer("gru")
    assert {n for n, _ in m.named_parameters()} == {
        "weights.0.input_proj.weight",
        "weights.0.input_proj.bias",
        "weights.0.R",
        "weights.0.b",
    }
    assert param_shapes(m) == {
        "input_proj.weight": (3 * H, IN),
        "input_proj.bias": (3 * H,),
        "R": (3, 1, H, H),
        "b": (3, 1, H),
    }
    assert m.weights[0].params is None


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
    assert m.weights[0].R is None
    assert param_shapes(m) == {
        "input_proj.weight": (H, IN),
        "input_proj.bias": (H,),
        "b": (1, NH, 3),
        "params": (1, NH, 3),
    }
    lru = layer("lru")  # no R, no b
    assert lru.weights[0].R is None and lru.weights[0].b is None
    assert set(param_shapes(lru)) == {"input_proj.weight", "input_proj.bias", "params"}


def test_initialisation() -> None:
    m = layer("peephole_lstm")
    k = 1 / math.sqrt(H)
    for name in ("input_proj.weight", "input_proj.bias", "R", "b"):
        p = m.get_parameter(f"weights.0.{name}")
        assert p.abs().max() <= k and p.std() > k / 4, name
    assert torch.equal(m.weights[0].params, torch.zeros(3, 1, H))


def test_params_start_at_declared_values() -> None:
    assert torch.equal(layer("indrnn", num_heads=NH).weights[0].params, torch.full((1, NH, 3), 0.5))
    assert torch.equal(layer("lru").weights[0].params, torch.full((1, 1, H), -3.0))
    m = layer("indrnn", num_layers=2)
    with torch.no_grad():
        m.weights[1].params.zero_()
    m.reset_parameters()
    assert torch.equal(m.weights[1].params, torch.full((1, 1, H), 0.5))


@pytest.mark.parametrize("name", ["lstm", "gru", "peephole_lstm", "slstm", "indrnn", "sru"])
def test_output_shapes(name: str) -> None:
    m = layer(name, num_heads=NH)
    cell = m.cell
    out, last = m(torch.randn(B, T, IN))
    assert out.shape == (B, T, len(cell.outputs) * H)
    assert last.shape == (len(cell.state_names), 1, B, H)


def test_outputs_are_the_cell_outputs_concatenated() -> None:
    m = layer("peephole_lstm", num_heads=NH)
    x = torch.randn(B, T, IN)
    out, last = m(x)
    w = m.weights[0]
    Wx = w.input_proj(x).view(B, T, 4, NH, H // NH)
    y, last_cell = m.cell(Wx, w.R, w.b, None, w.params)
    torch.testing.assert_close(out[..., :H], y[0].reshape(B, T, H))  # h
    torch.testing.assert_close(out[..., H:], y[1].reshape(B, T, H))  # c
    torch.testing.assert_close(last, last_cell.reshape(2, 1, B, H))
    torch.testing.assert_close(out[:, -1], last[:, 0].permute(1, 0, 2).reshape(B, 2 * H))


def test_batch_first_false() -> None:
    first = layer("lstm", num_heads=NH)
    second = layer("lstm", num_heads=NH, batch_first=False)
    second.load_state_dict(first.state_dict())
    x = torch.randn(B, T, IN)
    out1, last1 = first(x)
    out2, last2 = second(x.transpose(0, 1))
    assert out2.shape == (T, B, H) and last2.shape == (2, 1, B, H)
    torch.testing.assert_close(out2, out1.transpose(0, 1))
    torch.testing.assert_close(last2, last1)
    assert out2.is_contiguous()  # as nn.LSTM's: time-major code merges T and B with view
    torch.testing.assert_close(out2.view(T * B, H), out1.transpose(0, 1).reshape(T * B, H))


def test_bias_false() -> None:
    m = layer("lstm", bias=False)
    assert param_shapes(m) == {"input_proj.weight": (4 * H, IN), "R": (4, 1, H, H)}
    assert m.weights[0].b is None
    out, _ = m(torch.zeros(B, T, IN))
    assert torch.equal(out, torch.zeros(B, T, H))  # no bias anywhere: zero in, zero out
    assert m.state_dict().keys() == {"weights.0.input_proj.weight", "weights.0.R"}


def test_num_heads_must_divide_hidden_size() -> None:
    with pytest.raises(ValueError, match=r"^hidden_size=6 is not divisible by num_heads=4$"):
        rnncc.RNN(rnncc.load(EXAMPLES / "lstm.rnn"), IN, 6, num_heads=4)


def test_wrong_x_shape() -> None:
    m = layer("gru")
    with pytest.raises(ValueError) as err:
        m(torch.randn(B, T, IN + 1))
    tail = " with input_size=5, [T, input_size] (one sequence) or a PackedSequence"
    assert str(err.value) == "x has shape [3, 4, 6], expected [B, T, input_size]" + tail
    with pytest.raises(ValueError) as err:
        m(torch.randn(B, T, IN, 1))
    assert str(err.value) == "x has shape [3, 4, 5, 1], expected [B, T, input_size]" + tail
    with pytest.raises(ValueError) as err:
        layer("gru", batch_first=False)(torch.randn(T, B, 2))
    assert str(err.value) == "x has shape [4, 3, 2], expected [T, B, input_size]" + tail
    with pytest.raises(ValueError) as err:
        m(torch.randn(T, IN + 1))
    assert str(err.value) == (
        "x has shape [4, 6], expected [T, input_size=5] for one sequence (or a batch, or a "
        "PackedSequence)"
    )


def test_x_on_another_device_than_the_weights() -> None:
    m = layer("lstm")
    x = torch.randn(B, T, IN, device="meta")
    for call in (lambda: m(x), lambda: m(x[0]), lambda: m.step(x[:, 0])):
        with pytest.raises(ValueError) as err:
            call()
        assert str(err.value) == "x is on meta, expected cpu like the layer's weights"


def test_one_sequence_is_a_batch_of_one() -> None:
    m = layer("lstm", num_layers=2, bidirectional=True)
    x, s = torch.randn(T, IN), torch.randn(2, 4, H)
    out, last = m(x, s)
    batch_out, batch_last = m(x[None], s[:, :, None])
    torch.testing.assert_close((out, last), (batch_out[0], batch_last[:, :, 0]))
    assert out.shape == (T, 2 * H) and last.shape == (2, 4, H)
    time_major = layer("lstm", num_layers=2, bidirectional=True, batch_first=False)
    torch.testing.assert_close(time_major(x, s), (out, last))  # batch_first does not apply
    for bad, message in [
        (torch.randn(2, 4, 1, H), "states has shape [2, 4, 1, 6], expected [S=2 (h, c), "),
        ((s[0], s[1, :2]), "states for one sequence as a tuple hold one tensor "),
        ((s[0],), "states for one sequence as a tuple hold one tensor "),
    ]:
        with pytest.raises(ValueError) as err:
            m(x, bad)
        assert str(err.value).startswith(message), str(err.value)
    with pytest.raises(ValueError) as err:
        m(x, lengths=[2])
    assert str(err.value) == "lengths= is for a batch; x [T, input_size] is one sequence"
    # nn.GRU's h0 without its batch axis
    g = layer("gru")
    h0 = torch.randn(1, H)
    torch.testing.assert_close(g(x, h0), g(x, h0[None]))


def test_initial_states() -> None:
    m = layer("lstm", num_heads=NH)
    x = torch.randn(B, T, IN)
    zeros = torch.zeros(2, 1, B, H)
    torch.testing.assert_close(m(x, zeros), m(x))
    states = torch.randn(2, 1, B, H)
    out, last = m(x, states)
    assert not torch.allclose(out, m(x)[0])
    # the states are split into heads like the hidden units
    w = m.weights[0]
    Wx = w.input_proj(x).view(B, T, 4, NH, H // NH)
    y, last_cell = m.cell(Wx, w.R, w.b, states.view(2, B, NH, H // NH))
    torch.testing.assert_close(out, y[0].reshape(B, T, H))
    torch.testing.assert_close(last, last_cell.reshape(2, 1, B, H))
    # nn.LSTM's (h0, c0) is the same
    torch.testing.assert_close(m(x, (states[0], states[1])), (out, last))
    # a sequence run in two halves equals the whole
    out1, mid = m(x[:, :2])
    out2, last2 = m(x[:, 2:], mid)
    torch.testing.assert_close(torch.cat([out1, out2], 1), m(x)[0])
    torch.testing.assert_close(last2, m(x)[1])


def test_wrong_states_shape() -> None:
    m = layer("lstm")
    with pytest.raises(ValueError) as err:
        m(torch.randn(B, T, IN), torch.zeros(1, B, H))
    assert str(err.value) == (
        "states has shape [1, 3, 6], expected "
        "[S=2 (h, c), num_layers*num_directions=1, B=3, hidden_size=6]"
    )


@pytest.mark.parametrize("name", ["lstm", "gru", "peephole_lstm", "indrnn", "lru", "sru"])
def test_backward_reaches_every_parameter(name: str) -> None:
    m = layer(name, num_heads=NH)
    x = torch.randn(B, T, IN, requires_grad=True)
    states = torch.randn(len(m.cell.state_names), 1, B, H, requires_grad=True)
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
    assert "cell=gru, input_size=5, hidden_size=6, num_layers=1, num_heads=1" in repr(m)


def test_constructing_from_a_file_of_several_cells_says_how_to_choose(tmp_path) -> None:
    """RNN's first argument is the cell: the hint is rnncc.load's cell=, not RNN's."""
    two = tmp_path / "two.rnn"
    two.write_text((EXAMPLES / "lstm.rnn").read_text() + (EXAMPLES / "gru.rnn").read_text())
    with pytest.raises(rnncc.errors.CellSelectionError) as err:
        rnncc.RNN(two, IN, H)
    assert str(err.value) == (
        f"{two} defines several cells (lstm, gru); choose one with "
        f"rnncc.RNN(rnncc.load({str(two)!r}, cell='name'), ...)"
    )
    assert rnncc.RNN(rnncc.load(two, cell="gru"), IN, H).cell.name == "gru"


@pytest.mark.parametrize("kw", [{}, {"num_layers": 2, "bidirectional": True}], ids=["1", "2x2"])
def test_a_module_survives_checkpointing(tmp_path, kw) -> None:
    """Training scripts save whole models, deep-copy them (weight averaging) and pickle them
    into worker processes: each copy gives the original's results."""
    import copy
    import pickle

    m = layer("slstm", num_heads=NH, **kw)
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


# ---- stacked and bidirectional layers ----------------------------------------------------
def test_stacked_bidirectional_parameters() -> None:
    m = layer("peephole_lstm", num_heads=NH, num_layers=3, bidirectional=True)
    assert len(m.weights) == 6 and m.output_size == 2 * 2 * H  # two directions of h, c
    assert param_shapes(m, 1)["input_proj.weight"] == (4 * H, IN)  # layer 0, reverse
    for k in range(2, 6):  # later layers take the whole output of the one below
        assert param_shapes(m, k)["input_proj.weight"] == (4 * H, 4 * H)
    out, last = m(torch.randn(B, T, IN))
    assert out.shape == (B, T, 4 * H) and last.shape == (2, 6, B, H)


def test_stack_is_its_cell_calls_composed() -> None:
    """Layer by layer, direction by direction: the reverse direction is the cell called with
    ``reverse=True``, layer l + 1 takes layer l's directions concatenated (direction-major,
    then the outputs h, c), and ``last`` holds each (layer, direction) in h_n order. (The
    layer runs both directions in one call, as heads, and their input projections in one
    GEMM: equal up to the order of float64 sums.)"""
    m = layer("peephole_lstm", num_heads=NH, num_layers=2, bidirectional=True).double()
    x = torch.randn(B, T, IN, dtype=torch.float64)
    states = torch.randn(2, 4, B, H, dtype=torch.float64)
    lengths = torch.tensor([4, 1, 3])
    out, last = m(x, states, lengths=lengths)
    h, lasts = x, []
    for l in range(2):
        ys = []
        for d in range(2):
            w = m.weights[2 * l + d]
            Wx = w.input_proj(h).view(B, T, 4, NH, H // NH)
            s0 = states[:, 2 * l + d].reshape(2, B, NH, H // NH)
            y, lst = m.cell(Wx, w.R, w.b, s0, w.params, lengths=lengths, reverse=d == 1)
            ys.append(y.permute(1, 2, 0, 3, 4).reshape(B, T, 2 * H))
            lasts.append(lst.reshape(2, B, H))
        h = torch.cat(ys, -1)
    torch.testing.assert_close(out, h, rtol=0, atol=1e-12)
    torch.testing.assert_close(last, torch.stack(lasts, 1), rtol=0, atol=1e-12)
    assert torch.equal(out[1, 1:], torch.zeros(T - 1, 4 * H, dtype=torch.float64))


def test_lengths_and_packed_input_agree() -> None:
    m = layer("gru", num_layers=2, bidirectional=True)
    x = torch.randn(B, T, IN)
    lengths = [2, 4, 1]
    out, last = m(x, lengths=lengths)
    packed_out, packed_last = m(pack_padded_sequence(x, lengths, True, enforce_sorted=False))
    torch.testing.assert_close(packed_last, last)
    again = pack_padded_sequence(out, lengths, True, enforce_sorted=False)
    torch.testing.assert_close(packed_out.data, again.data)
    assert torch.equal(packed_out.batch_sizes, again.batch_sizes)
    assert torch.equal(packed_out.sorted_indices, again.sorted_indices)


def test_states_as_torch_takes_them() -> None:
    gru = layer("gru", num_layers=2)
    x = torch.randn(B, T, IN)
    h0 = torch.randn(2, B, H)
    torch.testing.assert_close(gru(x, h0), gru(x, h0[None]))  # GRU's h0 [L, B, H]
    lstm = layer("lstm", num_layers=2)
    h0, c0 = torch.randn(2, 2, B, H)
    torch.testing.assert_close(lstm(x, (h0, c0)), lstm(x, torch.stack([h0, c0])))
    torch.testing.assert_close(lstm(x, hx=(h0, c0)), lstm(x, (h0, c0)))  # nn.LSTM's keyword
    with pytest.raises(TypeError, match="as states or as hx, not both"):
        lstm(x, (h0, c0), hx=(h0, c0))


def test_padding_past_the_lengths_reaches_no_gradient() -> None:
    """A NaN in the padding stayed out of out and last but reached the input projection's
    weight gradient through the zero cotangent there."""
    m = layer("lstm", num_layers=2, bidirectional=True, backend="reference")
    x = torch.randn(B, T, IN)
    dirty = x.clone()
    dirty[1, 1:] = float("nan")
    dirty[2, 2:] = float("inf")
    outs = []
    for given in (x, dirty):
        m.zero_grad()
        out, last = m(given.requires_grad_(), lengths=[4, 1, 2])
        (out.square().sum() + last.sum()).backward()
        assert torch.isfinite(given.grad).all()
        outs.append((out, last, [p.grad.clone() for p in m.parameters()]))
    torch.testing.assert_close(outs[0], outs[1])


def _raises(message: str, fn, *args, **kwargs) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        fn(*args, **kwargs)


def test_wrong_states_lengths_and_packed_input() -> None:
    m = layer("lstm", num_layers=2, bidirectional=True)
    x = torch.randn(B, T, IN)
    one = "[num_layers*num_directions=4, B=3, hidden_size=6]"
    _raises(
        "states has shape [2, 2, 3, 6], expected "
        "[S=2 (h, c), num_layers*num_directions=4, B=3, hidden_size=6]",
        m,
        x,
        torch.zeros(2, 2, B, H),
    )
    _raises(
        f"states as a tuple holds one tensor {one} per state of cell 'lstm' (h, c); got 1 items",
        m,
        x,
        (torch.zeros(4, B, H),),
    )
    _raises(
        f"states[1] (c) has shape [4, 2, 6], expected {one}",
        m,
        x,
        (torch.zeros(4, B, H), torch.zeros(4, 2, H)),
    )
    _raises(
        "states[1] (c) is on meta, expected cpu like x",
        m,
        x,
        (torch.zeros(4, B, H), torch.zeros(4, B, H, device="meta")),
    )
    _raises(
        "states[1] (c) has dtype torch.float64, expected torch.float32 like states[0] (h)",
        m,
        x,
        (torch.zeros(4, B, H), torch.zeros(4, B, H, dtype=torch.float64)),
    )
    _raises(
        "states has dtype torch.float64, expected torch.float32 like the layer's weights",
        m,
        x,
        torch.zeros(2, 4, B, H, dtype=torch.float64),
    )
    _raises(
        "x has dtype torch.float64, expected torch.float32 like the layer's weights",
        m,
        x.double(),
    )
    _raises(
        "lengths must be [B=3] integers in 1..T=4, got [4, None, 2]", m, x, lengths=[4, None, 2]
    )
    _raises(
        "lengths must be [B=3] integers in 1..T=4, got ['4', '1', '2']",
        m,
        x,
        lengths=["4", "1", "2"],
    )
    _raises(
        "lengths has shape [2] (dtype torch.int64, on cpu), expected [B=3] integers in 1..T=4",
        m,
        x,
        lengths=[1, 2],
    )
    _raises(
        "lengths[2] = 5 (dtype torch.int64, on cpu) is outside 1..T=4: every row runs at "
        "least one and at most T steps",
        m,
        x,
        lengths=torch.tensor([1, 2, 5]),
    )
    packed = pack_padded_sequence(x, [4, 1, 2], True, enforce_sorted=False)
    empty, _ = m(torch.randn(0, T, IN), lengths=[])  # `[]` is no float tensor here
    assert empty.shape == (0, T, 2 * H)
    _raises(
        "lengths= is for padded tensors; a PackedSequence carries its own lengths",
        m,
        packed,
        lengths=[4, 1, 2],
    )
    wide = pack_padded_sequence(torch.randn(B, T, IN + 1), [4, 1, 2], True, enforce_sorted=False)
    _raises(
        "x is a PackedSequence of data shape [7, 6], expected [N, input_size=5]",
        m,
        wide,
    )
    gru = layer("gru", num_layers=2)  # h0 [L, B, H] named by the shape given
    _raises(
        "states (h0) has shape [2, 3, 7], expected [num_layers*num_directions=2, B=3, "
        "hidden_size=6] (or [S=1 (h), num_layers*num_directions=2, B=3, hidden_size=6])",
        gru,
        x,
        torch.zeros(2, B, H + 1),
    )


def test_autocast_refuses_what_nn_lstm_refuses() -> None:
    """Under autocast x was cast whatever its dtype (token ids ran), and a tuple of states of
    another 16-bit dtype failed inside autocast's stack."""
    m = layer("lstm", num_layers=2, bidirectional=True, backend="reference")
    x = torch.randn(B, T, IN)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for bad in (x.long(), x.bool(), x.double(), x.half()):
            _raises(
                f"x has dtype {bad.dtype}, expected torch.float32 like the layer's weights or "
                "torch.bfloat16 (autocast's)",
                m,
                bad,
            )
        h0 = torch.zeros(4, B, H, dtype=torch.float16)
        _raises(
            "states has dtype torch.float16, expected torch.float32 like the layer's weights",
            m,
            x,
            (h0, h0),
        )
        assert m(x.bfloat16(), (h0.bfloat16(), h0.bfloat16()))[0].dtype == torch.bfloat16


def test_bad_options() -> None:
    _raises("num_layers must be a positive int, got 0", layer, "lstm", num_layers=0)
    for name, value, what in (
        ("hidden_size", 0, "a positive"),
        ("hidden_size", 4.0, "a positive"),
        ("num_heads", 0, "a positive"),
        ("input_size", -1, "a non-negative"),
        ("input_size", True, "a non-negative"),
    ):
        kwargs = {"input_size": IN, "hidden_size": H, "num_heads": 1, name: value}
        with pytest.raises(ValueError) as err:
            rnncc.RNN(rnncc.load(EXAMPLES / "lstm.rnn"), **kwargs)
        assert str(err.value) == f"{name} must be {what} int, got {value!r}"
    _raises("dropout must be in [0, 1], got 1.5", layer, "lstm", num_layers=2, dropout=1.5)
    bad_backend = "backend must be one of auto, reference, stepwise, fused; got 'cuda'"
    _raises(bad_backend, layer, "lstm", backend="cuda")  # at construction, not at the first call
    m = layer("lstm")
    with pytest.raises(ValueError, match=re.escape(bad_backend)):
        m.backend = "cuda"
    m.backend = "reference"
    with pytest.warns(UserWarning, match="num_layers=1 has none"):
        layer("lstm", dropout=0.5)


def test_dropout_between_layers_in_training_only() -> None:
    m = layer("lstm", num_layers=2, dropout=0.5)
    x = torch.randn(B, T, IN)
    m.eval()
    out, _ = m(x)
    m.train()
    torch.manual_seed(1)
    out_a, _ = m(x)
    torch.manual_seed(1)
    out_b, _ = m(x)
    assert torch.equal(out_a, out_b) and not torch.allclose(out_a, out)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        one = layer("lstm", num_layers=1)
    one.train()
    torch.testing.assert_close(one(x), one.eval()(x), rtol=0, atol=0)  # nothing to drop


def test_autocast_runs_the_cell_in_16_bit_with_fp32_master_weights() -> None:
    """As nn.LSTM under autocast: inputs and weights cast to the autocast dtype for the call,
    the gradients reaching the float32 weights in float32."""
    m = layer("lstm", num_layers=2, bidirectional=True, backend="reference")
    x = torch.randn(B, T, IN)
    states = torch.randn(2, 4, B, H)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, last = m(x, states, lengths=[4, 2, 3])
    assert out.dtype == last.dtype == torch.bfloat16
    (out.float().square().sum() + last.float().sum()).backward()
    for name, p in m.named_parameters():
        assert p.dtype == p.grad.dtype == torch.float32, name
    # exactly the layer with its weights rounded to bf16, run on bf16 inputs
    low = layer("lstm", num_layers=2, bidirectional=True, dtype=torch.bfloat16)
    low.load_state_dict(m.state_dict())
    expected = low(x.bfloat16(), states.bfloat16(), lengths=[4, 2, 3])
    torch.testing.assert_close((out, last), expected, rtol=0, atol=0)
    # a packed input too (packing itself runs outside autocast, as for nn.LSTM)
    packed = pack_padded_sequence(x, [4, 2, 3], True, enforce_sorted=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        packed_out, packed_last = m(packed, states)
    torch.testing.assert_close(packed_last, last, rtol=0, atol=0)
    assert packed_out.data.dtype == torch.bfloat16


def test_a_layer_on_the_meta_device_gives_shapes() -> None:
    """Shape inference and deferred initialisation build models on ``meta``, where torch has
    no autocast (its ``is_autocast_enabled("meta")`` raises): a call there gives the shapes."""
    m = layer("lstm", num_layers=2, bidirectional=True, backend="reference", device="meta")
    out, last = m(torch.empty(B, T, IN, device="meta"), lengths=[4, 2, 3])
    assert out.device.type == last.device.type == "meta"
    assert out.shape == (B, T, 2 * H) and last.shape == (2, 4, B, H)


def test_torch_compile_of_a_layer() -> None:
    """The layer's Python traces whole (``fullgraph=True``; the GPU suite runs the same on the
    fused kernels, under the GPU machine's torch): outputs and gradients as eager. With
    ``lengths=`` or packed input the lengths' values are read on the host, which breaks the
    graph there, and the rest compiles."""
    m = layer("lstm", num_layers=2, bidirectional=True, backend="reference")
    x = torch.randn(B, T, IN)
    packed = pack_padded_sequence(x, [4, 2, 3], True, enforce_sorted=False)
    for inp, lengths, fullgraph in ((x, None, True), (packed, None, False), (x, [4, 2, 3], False)):
        m.zero_grad()
        out, last = m(inp, lengths=lengths)
        data = out.data if inp is packed else out
        (data.sum() + last.sum()).backward()
        eager = [p.grad.clone() for p in m.parameters()]
        m.zero_grad()
        compiled = torch.compile(m, fullgraph=fullgraph, backend="eager")
        out_c, last_c = compiled(inp, lengths=lengths)
        data_c = out_c.data if inp is packed else out_c
        (data_c.sum() + last_c.sum()).backward()
        torch.testing.assert_close((data_c, last_c), (data, last), rtol=0, atol=0)
        for p, g in zip(m.parameters(), eager, strict=True):
            torch.testing.assert_close(p.grad, g)


# ---- built-in cells ----------------------------------------------------------------------
def test_builtin_cells_are_the_examples() -> None:
    """The built-in cells ship inside the package; the examples of the same name are the
    same files, so there is one text of each cell."""
    from rnncc.resources import builtin_cell_path, builtin_cells

    assert builtin_cells() == ("elman", "elman_relu", "gru", "lstm")
    for name in ("elman", "gru", "lstm"):
        assert builtin_cell_path(name).read_bytes() == (EXAMPLES / f"{name}.rnn").read_bytes()
        assert rnncc.load_builtin(name).source() == rnncc.load(EXAMPLES / f"{name}.rnn").source()
    assert "relu(a)" in rnncc.load_builtin("elman_relu").source()
    _raises(
        "rnncc: no built-in cell 'lsmt'; the built-in cells are elman, elman_relu, gru, lstm",
        rnncc.load_builtin,
        "lsmt",
    )


def test_step_out_needs_the_decoding_kernel() -> None:
    m = layer("lstm", num_layers=2)
    with torch.no_grad(), pytest.raises(ValueError) as err:  # no_grad is not what is missing
        m.step(torch.randn(B, IN), out=(torch.empty(B, H), torch.empty(2, 2, B, H)))
    assert str(err.value) == (
        "out= is for steps that run the decoding kernel, and the step runs on cpu with "
        "backend='auto'; it is a CUDA kernel"
    )


@pytest.mark.parametrize(("name", "bias"), [("lstm", True), ("lstm", False), ("sru", True)])
def test_cell_weights_tensors_are_the_modules(name, bias) -> None:
    """What a decoding step reads from the module's dicts is what its attributes hold."""
    w = layer(name, bias=bias).weights[0]
    proj = w.input_proj
    want = (
        None if proj is None else proj.weight,
        None if proj is None else proj.bias,
        w.R,
        w.bias(),
        w.params,
    )
    got = w.tensors()
    assert len(got) == 5
    assert all(a is b for a, b in zip(got, want, strict=True))
    assert (got[3] is None) == (w.bias() is None) and (bias or got[1] is None)


def test_torch_func_transforms_are_refused_naming_the_layer() -> None:
    m = layer("lstm").double()
    x = torch.randn(B, T, IN, dtype=torch.float64)
    with pytest.raises(NotImplementedError, match=r"an RNN call does not run under torch.func"):
        torch.func.grad(lambda x: m(x)[0].sum())(x)
    with pytest.raises(NotImplementedError, match=r"RNN.step does not run under torch.func"):
        torch.func.vmap(lambda x: m.step(x)[0])(x)


def test_pickles_made_before_the_weights_moved_still_load() -> None:
    """Pickles of layers made before ``rnncc/runtime/weights.py`` name its classes in
    ``rnncc.runtime.module``: an old pickle's references, rewritten here, load."""
    import pickle

    import rnncc.runtime.module as module
    import rnncc.runtime.weights as weights

    m = layer("lstm", num_layers=2)
    m.prune_(0.5)
    data = pickle.dumps(m, protocol=2)  # class references as "module\nname" text
    assert b"rnncc.runtime.weights" in data
    old = data.replace(b"rnncc.runtime.weights", b"rnncc.runtime.module")
    back = pickle.loads(old)
    assert type(back.weights[0]) is weights.CellWeights is module.CellWeights
    x = torch.randn(B, T, IN)
    torch.testing.assert_close(back(x), m(x))
