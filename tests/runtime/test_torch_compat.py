"""``rnncc.RNN.from_torch`` / ``to_torch`` against torch.nn.LSTM, GRU and RNN (tanh, relu) in
float64 on the reference backend: outputs, last states, the gradients of the input, the initial
states and the weights (one SGD step) equal torch's to 1e-9, over stacked, bidirectional,
batch-first, padded and packed (unsorted lengths) inputs, with and without initial states."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

import rnncc

MODULES = {
    "lstm": (nn.LSTM, {}),
    "gru": (nn.GRU, {}),
    "rnn_tanh": (nn.RNN, {"nonlinearity": "tanh"}),
    "rnn_relu": (nn.RNN, {"nonlinearity": "relu"}),
}
B, T, I, H = 3, 4, 3, 2
LENGTHS = [2, 4, 1]  # unsorted, one row of full length, one of a single step
TOL = {"rtol": 1e-9, "atol": 1e-9}


def _torch_module(kind: str, seed: int = 0, **options) -> nn.RNNBase:
    cls, kw = MODULES[kind]
    torch.manual_seed(seed)
    return cls(I, H, dtype=torch.float64, **kw, **options)


def _run(module, x, states, lengths, how: str, cot: dict | None):
    """``(out, last)`` as tensors (a packed output as its data), and the loss's gradients
    with ``cot`` (None: drawn here) as cotangents."""
    first = module.batch_first
    ours = isinstance(module, rnncc.RNN)
    if how == "packed" or (how == "padded" and not ours):  # torch takes lengths packed only
        inp = pack_padded_sequence(x, lengths, first, enforce_sorted=False)
    else:
        inp = x
    if ours:
        out, last = module(inp, states, lengths=lengths if how == "padded" else None)
    else:
        out, last = module(inp, states)
        last = torch.stack(last) if isinstance(last, tuple) else last[None]
    if isinstance(out, PackedSequence):
        batch_sizes = out.batch_sizes
        out = pad_packed_sequence(out, first, total_length=T)[0] if how == "padded" else out.data
    else:
        batch_sizes = None
    if cot is None:
        g = torch.Generator().manual_seed(1)
        cot = {
            k: torch.randn(v.shape, generator=g, dtype=v.dtype)
            for k, v in (("out", out), ("last", last))
        }
    loss = (out * cot["out"]).sum() + (last * cot["last"]).sum()
    return out, last, batch_sizes, loss, cot


@pytest.mark.parametrize("how", ["full", "padded", "packed"])
@pytest.mark.parametrize("with_states", [False, True], ids=["zero-states", "states"])
@pytest.mark.parametrize("batch_first", [False, True], ids=["time-major", "batch-first"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("num_layers", [1, 2, 3])
@pytest.mark.parametrize("kind", MODULES)
def test_equals_torch(kind, num_layers, bidirectional, batch_first, with_states, how):
    theirs = _torch_module(
        kind, num_layers=num_layers, bidirectional=bidirectional, batch_first=batch_first
    )
    ours = rnncc.RNN.from_torch(theirs, backend="reference")
    K = num_layers * (2 if bidirectional else 1)
    g = torch.Generator().manual_seed(2)
    x = torch.randn((B, T, I) if batch_first else (T, B, I), generator=g, dtype=torch.float64)
    S = 2 if kind == "lstm" else 1
    s0 = torch.randn(S, K, B, H, generator=g, dtype=torch.float64)
    lengths = None if how == "full" else LENGTHS

    results = []
    cot = None
    for module in (theirs, ours):
        xg = x.clone().requires_grad_()
        states = [s.clone().requires_grad_() for s in s0] if with_states else []
        given = None if not states else (tuple(states) if kind == "lstm" else states[0])
        out, last, batch_sizes, loss, cot = _run(module, xg, given, lengths, how, cot)
        loss.backward()
        torch.optim.SGD(module.parameters(), lr=0.5).step()
        results.append((out, last, batch_sizes, xg.grad, [s.grad for s in states]))
    (out_t, last_t, bs_t, dx_t, ds_t), (out_o, last_o, bs_o, dx_o, ds_o) = results
    torch.testing.assert_close(out_o, out_t, **TOL)
    torch.testing.assert_close(last_o, last_t, **TOL)
    if bs_t is not None and how == "packed":
        assert torch.equal(bs_o, bs_t)
    torch.testing.assert_close(dx_o, dx_t, **TOL)
    for a, b in zip(ds_o, ds_t, strict=True):
        torch.testing.assert_close(a, b, **TOL)
    # one SGD step on each: the same weights after it
    back = dict(ours.to_torch().named_parameters())
    for name, p in theirs.named_parameters():
        torch.testing.assert_close(back[name], p, **TOL, msg=name)


@pytest.mark.parametrize("with_states", [False, True], ids=["zero-states", "states"])
@pytest.mark.parametrize("batch_first", [False, True], ids=["time-major", "batch-first"])
@pytest.mark.parametrize("kind", MODULES)
def test_one_sequence_equals_torch(kind, batch_first, with_states):
    """torch's unbatched input: x [T, I], states without their batch axis."""
    theirs = _torch_module(kind, num_layers=2, bidirectional=True, batch_first=batch_first)
    ours = rnncc.RNN.from_torch(theirs, backend="reference")
    S = 2 if kind == "lstm" else 1
    g = torch.Generator().manual_seed(2)
    x = torch.randn(T, I, generator=g, dtype=torch.float64)
    s0 = torch.randn(S, 4, H, generator=g, dtype=torch.float64)
    cot = torch.randn(T, 2 * H, generator=g, dtype=torch.float64)
    results = []
    for module in (theirs, ours):
        xg = x.clone().requires_grad_()
        states = [s.clone().requires_grad_() for s in s0] if with_states else []
        given = None if not states else (tuple(states) if kind == "lstm" else states[0])
        out, last = module(xg, given)
        if module is theirs:
            last = torch.stack(last) if isinstance(last, tuple) else last[None]
        assert out.shape == (T, 2 * H) and last.shape == (S, 4, H)
        ((out * cot).sum() + last.sum()).backward()
        results.append((out, last, xg.grad, [s.grad for s in states]))
    for a, b in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(a, b, **TOL)
    if with_states:  # the states as one tensor [S, L·dirs, H]
        out, last = ours(x, s0)
        torch.testing.assert_close((out, last), (results[1][0], results[1][1]), **TOL)


@pytest.mark.parametrize("kind", MODULES)
def test_options_round_trip(kind):
    theirs = _torch_module(
        kind, num_layers=2, bias=False, batch_first=True, dropout=0.25, bidirectional=True
    )
    ours = rnncc.RNN.from_torch(theirs)
    assert (ours.num_layers, ours.bias, ours.batch_first, ours.dropout, ours.bidirectional) == (
        2,
        False,
        True,
        0.25,
        True,
    )
    assert ours.weights[0].b is None and ours.weights[0].input_proj.bias is None
    back = ours.to_torch()
    assert type(back) is type(theirs) and back.dropout == 0.25 and not back.bias
    assert getattr(back, "nonlinearity", None) == getattr(theirs, "nonlinearity", None)
    assert back.state_dict().keys() == theirs.state_dict().keys()
    for (name, a), b in zip(back.state_dict().items(), theirs.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    x = torch.randn(B, T, I, dtype=torch.float64)
    theirs.eval(), ours.eval()
    out_t, _ = theirs(x)
    out_o, _ = ours(x)
    torch.testing.assert_close(out_o, out_t, **TOL)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("kind", MODULES)
def test_a_torch_checkpoint_loads(kind, bias):
    """A model's nn.LSTM swapped for rnncc.RNN loads the model's old state_dict."""
    theirs = nn.Sequential(_torch_module(kind, num_layers=2, bidirectional=True, bias=bias))
    ours = nn.Sequential(
        rnncc.RNN.from_torch(_torch_module(kind, 1, num_layers=2, bias=bias, bidirectional=True))
    )
    result = ours.load_state_dict(theirs.state_dict())  # strict
    assert not result.missing_keys and not result.unexpected_keys
    x = torch.randn(T, B, I, dtype=torch.float64)
    out_t, _ = theirs[0](x)
    out_o, _ = ours[0](x)
    torch.testing.assert_close(out_o, out_t, **TOL)
    # rnncc's own keys still load
    ours.load_state_dict(ours.state_dict())


def test_a_torch_checkpoint_loads_into_a_pruned_layer_keeping_its_masks():
    theirs = _torch_module("lstm", num_layers=2)
    ours = rnncc.RNN.from_torch(_torch_module("lstm", 1, num_layers=2)).prune_(0.5)
    masks = [w.R_mask.clone() for w in ours.weights]
    with pytest.raises(RuntimeError, match=r'Missing key\(s\) in state_dict: "weights\.0\.R_mask"'):
        ours.load_state_dict(theirs.state_dict())
    result = ours.load_state_dict(theirs.state_dict(), strict=False)
    assert result.missing_keys == ["weights.0.R_mask", "weights.1.R_mask"]
    for w, mask, sfx in zip(ours.weights, masks, ("_l0", "_l1"), strict=True):
        assert torch.equal(w.R_mask, mask)
        dense = getattr(theirs, f"weight_hh{sfx}").view(w.R.shape)
        assert torch.equal(w.R, torch.where(mask, dense, 0.0))


def test_a_torch_checkpoint_needs_an_equal_layer():
    from pathlib import Path

    examples = Path(__file__).resolve().parents[2] / "examples"
    checkpoint = _torch_module("lstm").state_dict()
    for layer, why in [
        (
            rnncc.RNN(rnncc.load_builtin("lstm"), I, H, num_heads=2, dtype=torch.float64),
            "num_heads=2: torch's modules have one head",
        ),
        (
            rnncc.RNN(examples / "slstm.rnn", I, H, dtype=torch.float64),
            "cell 'slstm' is not a built-in cell",
        ),
    ]:
        with pytest.raises(RuntimeError) as err:
            layer.load_state_dict(checkpoint)
        assert (
            "weight_ih_l0, weight_hh_l0, ...: a torch module's keys, which load only into a "
            f"layer equal to it: {why}"
        ) in str(err.value)
    # another torch module's weights (an LSTM's 4 gates into a GRU's 3): a size mismatch
    gru = rnncc.RNN(rnncc.load_builtin("gru"), I, H, dtype=torch.float64)
    with pytest.raises(
        RuntimeError,
        match=r"size mismatch for weights\.0\.R: copying a param "
        r"with shape torch\.Size\(\[8, 2\]\)",
    ):
        gru.load_state_dict(checkpoint)


@pytest.mark.parametrize("kind", MODULES)
def test_torch_weight_names_are_views_of_the_layers_weights(kind):
    """Code that reads or initialises nn.LSTM's weights by name runs on the layer."""
    theirs = _torch_module(kind, num_layers=2, bidirectional=True)
    ours = rnncc.RNN.from_torch(theirs)
    for name, p in theirs.named_parameters():
        view = getattr(ours, name)
        assert view.shape == p.shape and torch.equal(view, p), name
    for module in (theirs, ours):  # in-place initialisation, as model code does it
        torch.manual_seed(5)
        nn.init.orthogonal_(module.weight_hh_l1_reverse)
        with torch.no_grad():
            module.bias_ih_l0[H : 2 * H].fill_(1.0)
    x = torch.randn(T, B, I, dtype=torch.float64)
    torch.testing.assert_close(ours(x)[0], theirs(x)[0], **TOL)
    ours.flatten_parameters()  # nothing to do, as model code calls it
    assert [[t.shape for t in ts] for ts in ours.all_weights] == [
        [t.shape for t in ts] for ts in theirs.all_weights
    ]
    assert all(
        torch.equal(a, b)
        for ts, os_ in zip(theirs.all_weights, ours.all_weights, strict=True)
        for a, b in zip(ts, os_, strict=True)
    )
    for name in ("weight_hh_l2", "bias_ih_l0_forward", "weight_hh_l1_reverse_"):
        with pytest.raises(AttributeError, match=rf"^'RNN' object has no attribute '{name}'$"):
            getattr(ours, name)
    with pytest.raises(AttributeError, match=r"'bias_hh_l0' \(bias=False\)$"):
        _ = rnncc.RNN.from_torch(_torch_module(kind, bias=False)).bias_hh_l0
    with pytest.raises(AttributeError, match=r"need an equal torch module; num_heads=2"):
        _ = rnncc.RNN(rnncc.load_builtin("lstm"), I, 4, num_heads=2).weight_hh_l0


def test_assigning_a_torch_weight_name_says_what_to_do():
    """Weight-drop code sets ``module.weight_hh_l0 = w`` on torch; here that would only
    shadow the view and leave the weights the layer runs unchanged."""
    ours = rnncc.RNN.from_torch(_torch_module("lstm", num_layers=2, bidirectional=True))
    before = ours.weights[3].R.detach().clone()
    for value in (torch.zeros(4 * H, H), nn.Parameter(torch.zeros(4 * H, H))):
        with pytest.raises(TypeError) as err:
            ours.weight_hh_l1_reverse = value
        assert str(err.value) == (
            "cannot assign weight_hh_l1_reverse: on rnncc.RNN it is a view of the parameter "
            "weights.3.R in torch's shape; write its values in place (with torch.no_grad(): "
            "layer.weight_hh_l1_reverse.copy_(value)) or assign layer.weights[3].R"
        )
    assert torch.equal(ours.weights[3].R, before) and "weight_hh_l1_reverse" not in vars(ours)
    ours.weight_decay = 0.1  # other names are ordinary attributes
    assert ours.weight_decay == 0.1


def test_frozen_weights_stay_frozen_both_ways():
    module = _torch_module("lstm", num_layers=2)
    module.weight_hh_l0.requires_grad_(False)
    module.bias_ih_l1.requires_grad_(False)
    ours = rnncc.RNN.from_torch(module)
    frozen = {n for n, p in ours.named_parameters() if not p.requires_grad}
    assert frozen == {"weights.0.R", "weights.1.input_proj.bias"}
    back = ours.to_torch()
    assert {n for n, p in back.named_parameters() if not p.requires_grad} == {
        "weight_hh_l0",
        "bias_ih_l1",
    }


def test_from_torch_refuses_what_has_no_counterpart():
    with pytest.raises(ValueError, match=r"^LSTM with proj_size=2 has no rnncc counterpart"):
        rnncc.RNN.from_torch(nn.LSTM(I, 4, proj_size=2))
    with pytest.raises(ValueError, match=r"^RNN.from_torch takes torch.nn.LSTM, GRU or RNN"):
        rnncc.RNN.from_torch(nn.Linear(I, H))

    class Mine(nn.GRU):  # its forward may differ: the layer would not run it
        pass

    with pytest.raises(ValueError) as err:
        rnncc.RNN.from_torch(Mine(I, H))
    assert str(err.value).endswith(
        "got Mine, a subclass of nn.GRU whose own code would not carry over: make an rnncc.RNN "
        "of the built-in cell 'gru' with its sizes and load its state_dict"
    )


def test_to_torch_needs_a_builtin_cell_and_one_head():
    from pathlib import Path

    examples = Path(__file__).resolve().parents[2] / "examples"
    with pytest.raises(ValueError, match=r"^cell 'slstm' is not a built-in cell"):
        rnncc.RNN(examples / "slstm.rnn", I, 4).to_torch()
    with pytest.raises(ValueError, match=r"^num_heads=2: torch's modules have one head"):
        rnncc.RNN(rnncc.load_builtin("lstm"), I, 4, num_heads=2).to_torch()
    # the example files are the built-in cells
    assert isinstance(rnncc.RNN(examples / "gru.rnn", I, 4).to_torch(), nn.GRU)


def test_a_conversion_does_not_repeat_the_one_layer_dropout_warning():
    """torch warns when the one-layer module with dropout is made; from_torch and to_torch
    warned again for the copy."""
    with pytest.warns(UserWarning, match="dropout"):
        module = nn.LSTM(3, 4, dropout=0.2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        layer = rnncc.RNN.from_torch(module, backend="reference")
        back = layer.to_torch()
    assert layer.dropout == back.dropout == 0.2
    with pytest.warns(UserWarning, match="num_layers=1 has none"):  # a layer made directly
        rnncc.RNN(rnncc.load_builtin("lstm"), 3, 4, dropout=0.2)
