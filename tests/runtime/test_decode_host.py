"""The host side of ``rnncc.RNN.step``'s decoding path on the CPU: what each layer hands the
decoding kernel (``CellWeights.decoding``: R masked, that product kept until R or the mask
change), and ``RNN._decode``'s slicing of the stack's states, run with the reference step
standing in for the kernel and checked against the reference sequence call. The kernel
itself is tested under tests/gpu (test_decode_gpu.py)."""

from __future__ import annotations

import copy
import gc
import pickle
import weakref
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

import rnncc
import rnncc.runtime.module as module
from rnncc.runtime.weights import CellWeights

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
IN, H, NH, B = 5, 6, 2, 3  # head dim 3
F64 = torch.float64


def layer(name: str = "lstm", num_layers: int = 1, **kwargs) -> rnncc.RNN:
    torch.manual_seed(0)
    return rnncc.RNN(
        rnncc.load(EXAMPLES / f"{name}.rnn"), IN, H, num_layers, backend="reference", **kwargs
    )


def pruned(**kwargs) -> CellWeights:
    w = layer(dtype=F64, sparsity=0.5, **kwargs).weights[0]
    assert isinstance(w, CellWeights) and w.R is not None and w.R_mask is not None
    return w


def expect_R(w: CellWeights, dtype: torch.dtype = F64) -> torch.Tensor:
    assert w.R is not None and w.R_mask is not None
    return torch.where(w.R_mask, w.R.detach(), 0).to(dtype)


# ---- CellWeights.decoding ----------------------------------------------------------------
def test_dense_weights_are_handed_over_as_they_are() -> None:
    w = layer(dtype=F64).weights[0]
    assert all(a is b for a, b in zip(w.decoding(F64), w.tensors(), strict=True))
    cast = w.decoding(torch.float32)
    assert all(t is None or t.dtype == torch.float32 for t in cast)


def test_the_masked_R_is_kept_while_R_and_the_mask_are_unchanged() -> None:
    w = pruned()
    R = w.decoding(F64)[2]
    assert R is not None
    torch.testing.assert_close(R, expect_R(w), rtol=0, atol=0)
    assert w.decoding(F64)[2] is R
    assert R.grad_fn is None and not R.requires_grad  # holds no graph (nor R, nor the mask)
    with torch.inference_mode():
        assert w.decoding(F64)[2] is R
    with torch.no_grad():
        w.R.add_(1)
    with torch.inference_mode():  # made there, read by later steps outside it
        again = w.decoding(F64)[2]
    assert again is not None and not again.is_inference() and again.grad_fn is None
    torch.testing.assert_close(again, expect_R(w), rtol=0, atol=0)


def test_an_optimizer_step_on_R_makes_the_masked_R_again() -> None:
    w = pruned()
    assert w.R is not None
    before = w.decoding(F64)[2]
    w.R.grad = torch.ones_like(w.R)  # nonzero at dropped entries too: masked in the product
    torch.optim.SGD(w.parameters(), lr=0.5).step()
    after = w.decoding(F64)[2]
    assert after is not before
    torch.testing.assert_close(after, expect_R(w), rtol=0, atol=0)


def test_a_mask_changed_in_place_or_replaced_makes_the_masked_R_again() -> None:
    w = pruned()
    assert w.R_mask is not None
    first = w.decoding(F64)[2]
    w.R_mask[0, 0, 0] = False  # in place: the mask's version moves
    second = w.decoding(F64)[2]
    assert second is not first and second is not None and not second[0, 0, 0].any()
    torch.testing.assert_close(second, expect_R(w), rtol=0, atol=0)
    w.set_mask_(torch.ones_like(w.R_mask))  # a new mask tensor
    third = w.decoding(F64)[2]
    assert third is not second
    torch.testing.assert_close(third, expect_R(w), rtol=0, atol=0)


def test_a_replaced_mask_is_not_kept_alive() -> None:
    w = pruned()
    assert w.R_mask is not None
    old = weakref.ref(w.R_mask)
    w.decoding(F64)
    w.set_mask_(torch.ones_like(w.R_mask))
    gc.collect()
    assert old() is None


def test_the_masked_R_follows_the_dtype_and_conversions_of_the_module() -> None:
    w = pruned()
    R32 = w.decoding(torch.float32)[2]
    assert R32 is not None and R32.dtype == torch.float32
    torch.testing.assert_close(R32, expect_R(w, torch.float32), rtol=0, atol=0)
    w.float()
    R = w.decoding(torch.float32)[2]
    assert R is not R32
    torch.testing.assert_close(R, expect_R(w, torch.float32), rtol=0, atol=0)
    assert w.R is not None
    w.R.data = w.R.data * 2  # a new tensor under the same parameter
    torch.testing.assert_close(w.decoding(torch.float32)[2], expect_R(w, torch.float32))


def test_copies_and_pickles_make_their_own_masked_R() -> None:
    w = pruned()
    w.decoding(F64)
    for twin in (copy.deepcopy(w), pickle.loads(pickle.dumps(w))):
        assert twin.R is not None
        with torch.no_grad():
            twin.R.mul_(3)
        torch.testing.assert_close(twin.decoding(F64)[2], expect_R(twin), rtol=0, atol=0)
    torch.testing.assert_close(w.decoding(F64)[2], expect_R(w), rtol=0, atol=0)


def test_weights_made_in_inference_mode_are_masked_every_step() -> None:
    with torch.inference_mode():
        w = pruned()
        assert w.R is not None
        torch.testing.assert_close(w.decoding(F64)[2], expect_R(w), rtol=0, atol=0)
        w.R.mul_(2)  # no version counter to see this by
        torch.testing.assert_close(w.decoding(F64)[2], expect_R(w), rtol=0, atol=0)


# ---- RNN._decode, the reference step standing in for the kernel --------------------------
class ReferenceDecoder:
    """The decoding kernel's contract (``KernelOps.decode``) run by the reference step."""

    def __init__(self, cell: rnncc.CompiledCell) -> None:
        self.cell = cell

    def decode(self, x, W, Wb, Wx, R, b, states, params, y, new_states) -> None:
        _, *bnd = new_states.shape  # [S, B, NH, D] views, (B, NH, D) contiguous
        assert new_states[0].is_contiguous() and list(new_states.stride())[1:] == [
            bnd[1] * bnd[2],
            bnd[2],
            1,
        ]
        assert y is None or y.is_contiguous()
        _, Bs, NHs, D = states.shape
        if Wx is None:
            Wx = F.linear(x, W, Wb).view(Bs, -1, NHs, D)
        y_t, new = self.cell.step(Wx, R, b, states, params, backend="reference")
        new_states.copy_(new)
        if y is not None:
            y.copy_(y_t)

    def decode_stack(
        self, x, weights, present, states, heads, first, dropout, y, new_states
    ) -> None:
        """The host library's decode_stack (templates/stepwise_host.cpp), layer by layer."""
        S, L, B_, H_ = new_states.shape
        assert states.shape == new_states.shape and states.stride()[2:] == (H_, 1)
        assert new_states.stride()[2:] == (H_, 1) and y.is_contiguous()
        per = bin(present).count("1")
        assert 0 < present < 32 and len(weights) == L * per and dropout == 0.0
        O, D = y.shape[1] // H_, H_ // heads
        h, outs = x, None
        for layer in range(L):
            if layer:
                h = (
                    new_states[first, layer - 1]
                    if O == 1
                    else outs.permute(1, 0, 2, 3).reshape(B_, -1)
                )
            mine = iter(weights[layer * per : (layer + 1) * per])
            W, Wb, R, b, params = (next(mine) if present >> i & 1 else None for i in range(5))
            outs = torch.empty(O, B_, heads, D, dtype=y.dtype)
            self.decode(
                None if W is None else h,
                W,
                Wb,
                None,
                R,
                b,
                states[:, layer].view(S, B_, heads, D),
                params,
                outs,
                new_states[:, layer].view(S, B_, heads, D),
            )
        y.copy_(outs.permute(1, 0, 2, 3).reshape(B_, -1))


@pytest.fixture
def decoding(monkeypatch: pytest.MonkeyPatch):
    """``make(rnn)``: ``rnn`` whose steps take the decoding path with the reference decoder."""
    monkeypatch.setattr(module, "decodes", lambda *args: True)

    def make(rnn: rnncc.RNN) -> rnncc.RNN:
        monkeypatch.setattr(rnn.cell, "_decoder", lambda device: ReferenceDecoder(rnn.cell))
        return rnn

    return make


@pytest.mark.parametrize(
    "name", ["lstm", "gru", "sru", "peephole_lstm"]
)  # sru: h after c; peephole: O = 2
@pytest.mark.parametrize("num_layers", [1, 3])
@pytest.mark.parametrize("given", [False, True])
def test_decoding_steps_equal_the_sequence_call(decoding, name, num_layers, given) -> None:
    rnn = layer(name, num_layers, dtype=F64)
    S, O = len(rnn.cell.state_names), len(rnn.cell.outputs)
    xs = torch.randn(B, 4, IN, dtype=F64)
    h0 = torch.randn(S, num_layers, B, H, dtype=F64) if given else None
    want_y, want_last = rnn(xs, h0)
    decoding(rnn)
    states = h0
    bufs = [torch.empty(S, num_layers, B, H, dtype=F64) for _ in range(2)]
    out = torch.empty(B, O * H, dtype=F64)
    with torch.no_grad():
        for t in range(xs.shape[1]):
            if t % 2 and states is not None:  # every other step into out= buffers
                target = bufs[0] if states is not bufs[0] else bufs[1]
                y, states = rnn.step(xs[:, t], states, out=(out, target))
                assert y is out and states is target
            else:
                y, states = rnn.step(xs[:, t], states)
            torch.testing.assert_close(y, want_y[:, t], rtol=1e-12, atol=1e-12)
    assert rnn.cell.last_backend == "decode"
    torch.testing.assert_close(states, want_last, rtol=1e-12, atol=1e-12)


def test_decoding_a_pruned_stack_reads_R_as_it_is_now(decoding) -> None:
    rnn = layer(num_layers=2, dtype=F64, sparsity=0.5)
    x = torch.randn(B, IN, dtype=F64)
    decoding(rnn)
    with torch.no_grad():
        rnn.step(x)  # keeps each layer's masked R
        for w in rnn.weights:
            w.R.add_(0.25)  # also at dropped entries: the product drops them
            w.R_mask[0, :, 0] = True
        got_y, got_states = rnn.step(x)
    want_y, want_states = rnn(x[:, None])
    torch.testing.assert_close(got_y, want_y[:, 0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got_states, want_states, rtol=1e-12, atol=1e-12)
