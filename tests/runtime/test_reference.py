"""The reference backend: equal to torch.nn.LSTM/GRU/RNN with copied weights, gradcheck of
every example's five inputs, and its derived-backward autograd equal to torch autograd."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import rnncc
from rnncc.runtime.reference import forward_autograd
from rnncc.testing import random_inputs, rel_err

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.rnn"))
EX = {p.stem: p for p in EXAMPLES}
INPUTS = ("Wx", "R", "b", "states", "params")


def _torch_rnn_case(module: torch.nn.RNNBase, gates: int, B=3, T=6, I=5, seed=0):
    """Inputs of an rnncc cell equivalent to ``module`` (one layer, one direction)."""
    torch.manual_seed(seed)
    module = module.double()
    H = module.hidden_size
    x = torch.randn(B, T, I, dtype=torch.float64)
    Wx = (x @ module.weight_ih_l0.T + module.bias_ih_l0).view(B, T, gates, 1, H)
    R = module.weight_hh_l0.detach().view(gates, 1, H, H)
    b = module.bias_hh_l0.detach().view(gates, 1, H)
    return x, Wx.detach(), R, b


def test_lstm_matches_torch():
    B, H = 3, 7
    module = torch.nn.LSTM(5, H, batch_first=True)
    x, Wx, R, b = _torch_rnn_case(module, 4)
    h0, c0 = torch.randn(2, 1, B, H, dtype=torch.float64)
    out, (hn, cn) = module(x, (h0, c0))
    cell = rnncc.load(EX["lstm"])
    y, last = cell(Wx, R, b, torch.stack([h0[0], c0[0]]).view(2, B, 1, H), backend="reference")
    assert rel_err(y[0].reshape(B, -1, H), out) <= 1e-10
    assert rel_err(last[0].reshape(B, H), hn[0]) <= 1e-10
    assert rel_err(last[1].reshape(B, H), cn[0]) <= 1e-10


def test_gru_matches_torch():
    B, H = 3, 7
    module = torch.nn.GRU(5, H, batch_first=True)
    x, Wx, R, b = _torch_rnn_case(module, 3)
    h0 = torch.randn(1, B, H, dtype=torch.float64)
    out, hn = module(x, h0)
    cell = rnncc.load(EX["gru"])
    y, last = cell(Wx, R, b, h0.view(1, B, 1, H), backend="reference")
    assert rel_err(y[0].reshape(B, -1, H), out) <= 1e-10
    assert rel_err(last[0].reshape(B, H), hn[0]) <= 1e-10


def test_elman_matches_torch():
    B, H = 2, 4
    module = torch.nn.RNN(5, H, batch_first=True, nonlinearity="tanh")
    x, Wx, R, b = _torch_rnn_case(module, 1, B=B)
    h0 = torch.randn(1, B, H, dtype=torch.float64)
    out, hn = module(x, h0)
    y, last = rnncc.load(EX["elman"])(Wx, R, b, h0.view(1, B, 1, H), backend="reference")
    assert rel_err(y[0].reshape(B, -1, H), out) <= 1e-10
    assert rel_err(last[0].reshape(B, H), hn[0]) <= 1e-10


def test_lstm_multi_head_is_block_diagonal():
    """Two heads equal two independent single-head runs."""
    cell = rnncc.load(EX["lstm"])
    x = random_inputs(cell.ir, 2, 4, 2, 3, seed=1)
    y, last = cell(*(x[k] for k in INPUTS), backend="reference")
    for h in range(2):
        part = {
            "Wx": x["Wx"][:, :, :, h : h + 1],
            "R": x["R"][:, h : h + 1],
            "b": x["b"][:, h : h + 1],
            "states": x["states"][:, :, h : h + 1],
            "params": None,
        }
        yh, lh = cell(*(part[k] for k in INPUTS), backend="reference")
        assert rel_err(yh, y[:, :, :, h : h + 1]) <= 1e-12
        assert rel_err(lh, last[:, :, h : h + 1]) <= 1e-12


def _reference_fn(cell, names):
    def f(*a):
        kw = dict(zip(names, a))
        return cell(
            kw["Wx"], kw.get("R"), kw.get("b"), kw["states"], kw.get("params"), backend="reference"
        )

    return f


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_gradcheck_every_input(path):
    cell = rnncc.load(path)
    x = random_inputs(cell.ir, 2, 3, 2, 2, seed=7)
    names = [k for k in INPUTS if x[k] is not None]
    args = [x[k].requires_grad_() for k in names]
    assert torch.autograd.gradcheck(_reference_fn(cell, names), args)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_derived_backward_equals_torch_autograd(path):
    cell = rnncc.load(path)
    x = random_inputs(cell.ir, 3, 5, 2, 4, seed=11)
    if cell.name == "slstm":  # exercise the n == 0 branch too
        x["states"][2, 0] = 0.0
    names = [k for k in INPUTS if x[k] is not None]
    g = torch.Generator().manual_seed(0)
    results = []
    for run in (lambda *a: cell(*a, backend="reference"), lambda *a: forward_autograd(cell.ir, *a)):
        args = {k: x[k].clone().requires_grad_() for k in names}
        y, last = run(args["Wx"], args.get("R"), args.get("b"), args["states"], args.get("params"))
        g = torch.Generator().manual_seed(0)
        loss = (y * torch.randn(y.shape, generator=g, dtype=y.dtype)).sum() + (
            last * torch.randn(last.shape, generator=g, dtype=y.dtype)
        ).sum()
        grads = torch.autograd.grad(loss, [args[k] for k in names])
        results.append(((y, last), grads))
    (ya, la), ga = results[0]
    (yb, lb), gb = results[1]
    assert rel_err(ya, yb) == 0.0 and rel_err(la, lb) == 0.0
    for name, a, b in zip(names, ga, gb, strict=True):
        assert rel_err(a, b) <= 1e-12, name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_low_precision_computes_in_float32(dtype):
    cell = rnncc.load(EX["lstm"])
    x = random_inputs(cell.ir, 2, 8, 1, 8, seed=3)
    y64, _ = cell(*(x[k] for k in INPUTS))
    low = {k: None if v is None else v.to(dtype) for k, v in x.items()}
    y, last = cell(*(low[k] for k in INPUTS))
    assert y.dtype == dtype and last.dtype == dtype
    ref, _ = cell(*(None if low[k] is None else low[k].double() for k in INPUTS))
    assert rel_err(y, ref) <= (1e-6 if dtype == torch.float32 else 1e-2)
    assert rel_err(y, y64) <= (1e-5 if dtype == torch.float32 else 5e-2)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_gradgradcheck_every_input(path):
    """Second-order gradients of the reference backend (its backward is differentiable)."""
    cell = rnncc.load(path)
    x = random_inputs(cell.ir, 2, 2, 1, 2, seed=5)
    names = [k for k in INPUTS if x[k] is not None]
    args = [x[k].requires_grad_() for k in names]
    assert torch.autograd.gradgradcheck(_reference_fn(cell, names), args)


def test_gradient_penalty_matches_torch_autograd():
    """A gradient penalty on top of the loss: the derived backward, differentiated again,
    equals torch autograd's second derivative of the plain forward (R's gradient included)."""
    cell = rnncc.load(EX["lstm"])
    x = random_inputs(cell.ir, 2, 4, 1, 3, seed=2)
    names = [k for k in INPUTS if x[k] is not None]
    results = []
    for run in (lambda *a: cell(*a, backend="reference"), lambda *a: forward_autograd(cell.ir, *a)):
        args = {k: x[k].clone().requires_grad_() for k in names}
        y, last = run(args["Wx"], args["R"], args["b"], args["states"], None)
        loss = (y**2).sum() + last.sum()
        (gWx,) = torch.autograd.grad(loss, [args["Wx"]], create_graph=True)
        total = loss + (gWx**2).sum()
        results.append(torch.autograd.grad(total, [args[k] for k in names]))
    for name, a, b in zip(names, *results, strict=True):
        assert rel_err(a, b) <= 1e-12, name


# ---- per-row lengths and the reverse direction --------------------------------------------
LENGTHS = torch.tensor([2, 4, 1])  # B = 3, T = 4: unsorted, one full row


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("name", ["lstm", "gru", "slstm", "peephole_lstm"])
def test_each_row_runs_its_own_length(name, reverse):
    """A row of length L is the same row run alone over its first L positions (in reverse
    order for ``reverse``, its outputs stored at the positions they consumed); 0 past L."""
    cell = rnncc.load(EX[name])
    x = random_inputs(cell.ir, 3, 4, 2, 3, seed=4)
    y, last = cell(*(x[k] for k in INPUTS), lengths=LENGTHS, reverse=reverse)
    for b, L in enumerate(LENGTHS.tolist()):
        row = dict(x, Wx=x["Wx"][b : b + 1, :L], states=x["states"][:, b : b + 1])
        if reverse:
            row["Wx"] = row["Wx"].flip(1)
        y_b, last_b = cell(*(row[k] for k in INPUTS))
        if reverse:
            y_b = y_b.flip(2)
        # (not bit for bit: a batch of one runs another matrix-product kernel)
        assert rel_err(y[:, b : b + 1, :L], y_b) <= 1e-14
        assert torch.equal(y[:, b, L:], torch.zeros_like(y[:, b, L:]))
        assert rel_err(last[:, b : b + 1], last_b) <= 1e-14


def test_reverse_without_lengths_runs_the_flipped_sequence():
    cell = rnncc.load(EX["lstm"])
    x = random_inputs(cell.ir, 2, 5, 1, 3, seed=6)
    y, last = cell(*(x[k] for k in INPUTS), reverse=True)
    flipped = dict(x, Wx=x["Wx"].flip(1))
    y_f, last_f = cell(*(flipped[k] for k in INPUTS))
    assert torch.equal(y, y_f.flip(2)) and torch.equal(last, last_f)


@pytest.mark.parametrize("name", ["lstm", "slstm"])
def test_reversed_heads_are_their_own_reversed_call(name):
    """reverse as one bool per head: the reversed heads (the last ones) run as a reversed call
    of their own, the others as a forward one; gradients included (a bidirectional layer's
    two directions as the halves of its heads)."""
    cell = rnncc.load(EX[name])
    x = random_inputs(cell.ir, 3, 4, 3, 2, seed=5)
    names = [k for k in INPUTS if x[k] is not None]
    args = {k: x[k].clone().requires_grad_() for k in names}
    y, last = cell(*(args.get(k) for k in INPUTS), lengths=LENGTHS, reverse=[False, True, True])
    parts = []
    for heads, reverse in ((slice(0, 1), False), (slice(1, 3), True)):
        part = {k: x[k][..., heads, :] if k != "R" else x[k][:, heads] for k in names}
        part = {k: v.clone().requires_grad_() for k, v in part.items()}
        parts.append((part, cell(*(part.get(k) for k in INPUTS), lengths=LENGTHS, reverse=reverse)))
    # (not bit for bit: fewer heads may run another matrix-product kernel)
    assert rel_err(y, torch.cat([p[1][0] for p in parts], dim=3)) <= 1e-14
    assert rel_err(last, torch.cat([p[1][1] for p in parts], dim=2)) <= 1e-14
    g = torch.Generator().manual_seed(1)
    dy, dlast = (
        torch.randn(y.shape, generator=g, dtype=y.dtype),
        torch.randn(last.shape, generator=g, dtype=y.dtype),
    )
    whole = torch.autograd.grad((y * dy).sum() + (last * dlast).sum(), [args[k] for k in names])
    for (part, (yp, lp)), heads in zip(parts, (slice(0, 1), slice(1, 3)), strict=True):
        loss = (yp * dy[..., heads, :]).sum() + (lp * dlast[..., heads, :]).sum()
        grads = torch.autograd.grad(loss, [part[k] for k in names])
        for k, gw, gp in zip(names, whole, grads, strict=True):
            ours = gw[:, heads] if k == "R" else gw[..., heads, :]
            assert rel_err(ours, gp) <= 1e-14, k


def _masked_fn(cell, names, lengths, reverse):
    def f(*a):
        kw = dict(zip(names, a))
        return cell(
            kw["Wx"],
            kw.get("R"),
            kw.get("b"),
            kw["states"],
            kw.get("params"),
            backend="reference",
            lengths=lengths,
            reverse=reverse,
        )

    return f


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("name", ["lstm", "gru", "slstm", "peephole_lstm", "lru"])
def test_gradcheck_with_lengths(name, reverse):
    cell = rnncc.load(EX[name])
    x = random_inputs(cell.ir, 3, 4, 1, 2, seed=8)
    names = [k for k in INPUTS if x[k] is not None]
    args = [x[k].requires_grad_() for k in names]
    assert torch.autograd.gradcheck(_masked_fn(cell, names, LENGTHS, reverse), args)


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_gradgradcheck_with_lengths(reverse):
    cell = rnncc.load(EX["lstm"])
    x = random_inputs(cell.ir, 3, 4, 1, 2, seed=9)
    names = [k for k in INPUTS if x[k] is not None]
    args = [x[k].requires_grad_() for k in names]
    assert torch.autograd.gradgradcheck(_masked_fn(cell, names, LENGTHS, reverse), args)


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_derived_backward_with_lengths_equals_torch_autograd(path, reverse):
    """Past a row's length the backward passes the state cotangents through and gives zero
    gate and param cotangents: the same gradients as torch autograd through the forward."""
    cell = rnncc.load(path)
    x = random_inputs(cell.ir, 3, 4, 2, 3, seed=12)
    names = [k for k in INPUTS if x[k] is not None]
    results = []
    for run in (
        lambda *a: cell(*a, backend="reference", lengths=LENGTHS, reverse=reverse),
        lambda *a: forward_autograd(
            cell.ir, *a, lengths=LENGTHS, reverse_from=0 if reverse else None
        ),
    ):
        args = {k: x[k].clone().requires_grad_() for k in names}
        y, last = run(args["Wx"], args.get("R"), args.get("b"), args["states"], args.get("params"))
        g = torch.Generator().manual_seed(0)
        loss = (y * torch.randn(y.shape, generator=g, dtype=y.dtype)).sum() + (
            last * torch.randn(last.shape, generator=g, dtype=y.dtype)
        ).sum()
        results.append(((y, last), torch.autograd.grad(loss, [args[k] for k in names])))
    (ya, la), ga = results[0]
    (yb, lb), gb = results[1]
    assert rel_err(ya, yb) == 0.0 and rel_err(la, lb) == 0.0
    for name, a, b in zip(names, ga, gb, strict=True):
        assert rel_err(a, b) <= 1e-12, name


def test_kernel_backends_get_a_timeline_plan_and_int32_lengths(monkeypatch):
    """A call with lengths= or reverse= that a CUDA backend runs plans the kernels built with
    per-row lengths (timeline) and hands them the lengths as int32 (what they read); a
    full-length forward call plans the others (the CUDA side: tests/gpu/test_timeline_gpu.py)."""
    from types import SimpleNamespace

    cell = rnncc.load(EX["lstm"])
    x = random_inputs(cell.ir, 3, 4, 1, 2)
    seen: list = []
    monkeypatch.setattr(
        cell,
        "_choose",
        lambda backend, Wx, sizes, timeline=False, mask=None: (
            seen.append(timeline) or SimpleNamespace(fused=True, launch="launch")
        ),
    )
    monkeypatch.setattr(
        cell, "_ops_for", lambda *a: lambda *args: seen.append(args[5:]) or ("y", "last")
    )
    for kw in ({"lengths": LENGTHS}, {"reverse": True}, {}):
        assert cell(*(x[k] for k in INPUTS), **kw) == ("y", "last")
    (t1, (l1, lengths, r1)), (t2, (_, none, r2)), (t3, (_, _, r3)) = zip(
        seen[::2], seen[1::2], strict=True
    )
    # the first reversed head: NH = 1 (none) or 0 (all)
    assert (t1, t2, t3) == (True, True, False) and (r1, r2, r3) == (1, 0, 1)
    assert l1 == "launch" and none is None
    assert lengths.dtype == torch.int32 and lengths.tolist() == LENGTHS.tolist()
