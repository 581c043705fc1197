"""A sparse R in ``rnncc.RNN``: ``sparsity=``, ``prune_`` and ``set_masks_`` (their masks and
errors), the masked layer against the dense layer holding ``R * mask``, the zeros kept through
training (gradients, optimizers, autocast), checkpoints and ``to_torch``. CPU, reference
backend; the sparse kernel's own tests are under tests/gpu and tests/variants."""

from __future__ import annotations

import copy
import math
import pickle
from pathlib import Path

import pytest
import torch

import rnncc
from rnncc.runtime.sparsity import magnitude_mask

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
IN, H, NH, B, T = 5, 6, 2, 3, 4  # head dim 3
F64 = torch.float64


def layer(name: str = "lstm", seed: int = 0, **kwargs) -> rnncc.RNN:
    torch.manual_seed(seed)
    kwargs.setdefault("backend", "reference")
    return rnncc.RNN(rnncc.load(EXAMPLES / f"{name}.rnn"), IN, H, **kwargs)


def masks(m: rnncc.RNN) -> list[torch.Tensor]:
    return [w.R_mask for w in m.weights]


def dense_twin(m: rnncc.RNN) -> rnncc.RNN:
    """A dense copy of ``m`` whose R is ``m``'s R * mask: what the masked layer computes."""
    twin = copy.deepcopy(m)
    for w in twin.weights:
        if w.R_mask is not None:
            w.R.data = torch.where(w.R_mask, w.R.data, 0)
            w.R_mask = None
    return twin


def smudge(m: rnncc.RNN) -> None:
    """Write non-zeros into R's dropped entries behind the layer's back: what the layer
    computes must still be R * mask (the mask reaches every cell call)."""
    with torch.no_grad():
        for w in m.weights:
            w.R.masked_fill_(~w.R_mask, 7.0)


def x_of(m: rnncc.RNN, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, T, IN, generator=g, dtype=m.weights[0].R.dtype)


# ---- the masks ---------------------------------------------------------------------------
def test_prune_keeps_the_largest_entries_of_each_gate_and_head() -> None:
    m = layer(num_heads=NH)
    R0 = m.weights[0].R.detach().clone()
    assert m.prune_(0.5) is m
    mask, R = m.weights[0].R_mask, m.weights[0].R.detach()
    assert mask.dtype == torch.bool and mask.shape == R0.shape == (4, NH, 3, 3)
    keep = math.ceil(0.5 * 9)
    assert (mask.sum((2, 3)) == keep).all()
    assert torch.equal(mask, magnitude_mask(R0, 0.5))
    assert torch.equal(R, torch.where(mask, R0, 0))
    # every kept |R| of a (gate, head) is at least every dropped one
    a = R0.abs().flatten(2)
    m2 = mask.flatten(2)
    kept_min = torch.where(m2, a, math.inf).amin(2)
    dropped_max = torch.where(m2, -math.inf, a).amax(2)
    assert (kept_min >= dropped_max).all()
    assert "weights.0.R_mask" in m.state_dict()
    assert dict(m.named_buffers())["weights.0.R_mask"] is mask


def test_pruning_again_ranks_only_the_kept_entries() -> None:
    """Whatever R holds where the mask drops (an optimizer made before the pruning moves those
    entries with its momentum; an in-place init through weight_hh_l0 writes them), pruning
    again keeps its count among the entries kept."""
    m = layer(num_heads=NH, sparsity=0.5)
    kept = m.weights[0].R_mask.clone()
    with torch.no_grad():
        m.weights[0].R.add_(torch.where(kept, 0.0, 100.0))  # large values where it drops
    m.prune_(0.25)
    mask = m.weights[0].R_mask
    assert (mask.sum((2, 3)) == math.ceil(0.25 * 9)).all() and not (mask & ~kept).any()


def test_sparsity_prunes_at_construction() -> None:
    m = layer(num_heads=NH, num_layers=2, bidirectional=True, sparsity=0.25)
    twin = layer(num_heads=NH, num_layers=2, bidirectional=True).prune_(0.25)
    assert m.sparsity == 0.25 and "sparsity=0.25" in repr(m)
    assert "sparsity" not in repr(twin)
    for a, b in zip(m.state_dict().values(), twin.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    for mask in masks(m):
        assert (mask.sum((2, 3)) == math.ceil(0.25 * 9)).all()


def test_pruning_again_selects_among_the_kept_entries() -> None:
    m = layer(num_heads=NH).prune_(0.5)
    first = m.weights[0].R_mask.clone()
    m.prune_(0.25)
    second = m.weights[0].R_mask
    assert (second.sum((2, 3)) == math.ceil(0.25 * 9)).all()
    assert not (second & ~first).any()
    m.prune_(0.9)  # above the current density: nothing changes
    assert torch.equal(m.weights[0].R_mask, second)


def test_set_masks_keeps_copies_and_zeroes_r() -> None:
    m = layer(num_layers=2)
    g = torch.Generator().manual_seed(3)
    given = [torch.rand(w.R.shape, generator=g) < 0.4 for w in m.weights]
    R0 = [w.R.detach().clone() for w in m.weights]
    assert m.set_masks_(given) is m
    for w, mask, r0 in zip(m.weights, given, R0, strict=True):
        assert torch.equal(w.R_mask, mask) and w.R_mask is not mask
        assert torch.equal(w.R.detach(), torch.where(mask, r0, 0))


def test_reset_parameters_keeps_the_mask() -> None:
    m = layer(sparsity=0.3)
    mask = m.weights[0].R_mask.clone()
    m.reset_parameters()
    assert torch.equal(m.weights[0].R_mask, mask)
    assert (m.weights[0].R.detach()[~mask] == 0).all()


# ---- what a masked layer computes --------------------------------------------------------
@pytest.mark.parametrize(
    "kw",
    [{"num_heads": NH}, {"num_layers": 2, "bidirectional": True, "num_heads": NH}],
    ids=["1", "2x2"],
)
def test_forward_is_the_dense_layer_with_r_times_mask(kw) -> None:
    m = layer(dtype=F64, sparsity=0.4, **kw)
    smudge(m)
    twin = dense_twin(m)
    x = x_of(m)
    out, last = m(x, lengths=[4, 2, 3])
    want_out, want_last = twin(x, lengths=[4, 2, 3])
    torch.testing.assert_close(out, want_out, rtol=0, atol=0)
    torch.testing.assert_close(last, want_last, rtol=0, atol=0)


def test_bidirectional_mask_follows_new_masks() -> None:
    """A layer's concatenated mask is kept between calls; new or changed masks replace it."""
    m = layer(dtype=F64, num_layers=2, bidirectional=True, sparsity=0.5)
    x = x_of(m)
    m(x)
    g = torch.Generator().manual_seed(4)
    m.set_masks_([torch.rand(w.R.shape, generator=g) < 0.3 for w in m.weights])
    smudge(m)
    torch.testing.assert_close(m(x), dense_twin(m)(x), rtol=0, atol=0)
    m.weights[1].R_mask.fill_(True)  # in place
    torch.testing.assert_close(m(x), dense_twin(m)(x), rtol=0, atol=0)
    # through .data, which moves neither the tensor nor its version counter: the joined mask
    # was kept and the layer ran the old one (the GPU's cache also keys on the storage)
    m.weights[0].R_mask.data[0] = False
    torch.testing.assert_close(m(x), dense_twin(m)(x), rtol=0, atol=0)
    m.weights[2].R_mask.data = torch.rand(m.weights[2].R.shape, generator=g) < 0.3
    smudge(m)
    torch.testing.assert_close(m(x), dense_twin(m)(x), rtol=0, atol=0)


def test_a_pruned_bidirectional_layer_traces_whole() -> None:
    """torch.compile(fullgraph=True) after an eager call: the joined mask's cache compared
    version counters, which dynamo cannot guard on (a data-dependent expression error)."""
    m = layer(num_layers=2, bidirectional=True, sparsity=0.5)
    x = x_of(m)
    eager = m(x)  # a joined mask kept from an eager call
    compiled = torch.compile(m, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), eager)


def test_a_layer_of_masked_and_dense_directions() -> None:
    m = layer(dtype=F64, bidirectional=True)
    w = m.weights[1]
    w.set_mask_(magnitude_mask(w.R, 0.3))  # the reverse direction only
    clean = w.R.detach().clone()
    with torch.no_grad():
        w.R.masked_fill_(~w.R_mask, 7.0)
    twin = dense_twin(m)
    assert torch.equal(twin.weights[1].R.detach(), clean)
    x = x_of(m)
    torch.testing.assert_close(m(x), twin(x), rtol=0, atol=0)


def test_step_is_the_dense_layer_with_r_times_mask() -> None:
    m = layer(dtype=F64, num_layers=2, sparsity=0.4)
    smudge(m)
    x_t = x_of(m)[:, 0]
    states = torch.randn(2, 2, B, H, dtype=F64)  # h ≠ 0: R h counts
    got = m.step(x_t, states)
    torch.testing.assert_close(got, dense_twin(m).step(x_t, states), rtol=0, atol=0)


def test_r_gradient_is_zero_at_dropped_entries() -> None:
    m = layer(dtype=F64, num_heads=NH, num_layers=2, bidirectional=True, sparsity=0.4)
    smudge(m)
    out, last = m(x_of(m))
    (out.square().sum() + last.sum()).backward()
    for w in m.weights:
        assert (w.R.grad[~w.R_mask] == 0).all()
        assert (w.R.grad[w.R_mask] != 0).any()


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.1),
    "adam": lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.1),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.01),
}


@pytest.mark.parametrize("opt", OPTIMIZERS)
def test_optimizers_keep_the_dropped_entries_zero(opt) -> None:
    m = layer(dtype=F64, num_heads=NH, num_layers=2, sparsity=0.3)
    before = [w.R.detach().clone() for w in m.weights]
    optimizer = OPTIMIZERS[opt](m.parameters())
    for step in range(5):
        optimizer.zero_grad()
        out, _ = m(x_of(m, seed=step))
        out.square().sum().backward()
        optimizer.step()
    for w, r0 in zip(m.weights, before, strict=True):
        R = w.R.detach()
        assert (R[~w.R_mask] == 0).all()
        assert not torch.equal(R[w.R_mask], r0[w.R_mask])  # the kept ones trained


def test_autocast_keeps_the_fp32_master_weights_zero() -> None:
    m = layer(num_heads=NH, num_layers=2, bidirectional=True, sparsity=0.3)
    optimizer = torch.optim.AdamW(m.parameters(), lr=0.01)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = m(torch.randn(B, T, IN))
    assert out.dtype == torch.bfloat16
    out.float().square().sum().backward()
    optimizer.step()
    for w in m.weights:
        assert w.R.dtype == w.R.grad.dtype == torch.float32
        assert (w.R.grad[~w.R_mask] == 0).all()
        assert (w.R.detach()[~w.R_mask] == 0).all()


# ---- checkpoints and torch ---------------------------------------------------------------
def test_state_dict_round_trip() -> None:
    m = layer(dtype=F64, num_heads=NH, num_layers=2, bidirectional=True, sparsity=0.4)
    x = x_of(m)
    want = m(x)
    state = m.state_dict()
    assert {k for k in state if k.endswith("R_mask")} == {f"weights.{k}.R_mask" for k in range(4)}
    kw = {"dtype": F64, "num_heads": NH, "num_layers": 2, "bidirectional": True}
    for fresh in (layer(seed=5, sparsity=0.7, **kw), layer(seed=5, **kw)):  # pruned, dense
        fresh.load_state_dict(state)
        assert all(torch.equal(a, b) for a, b in zip(masks(fresh), masks(m), strict=True))
        torch.testing.assert_close(fresh(x), want, rtol=0, atol=0)


def test_a_dense_checkpoint_does_not_load_strictly_into_a_pruned_layer() -> None:
    dense = layer(seed=5)
    m = layer(sparsity=0.3)
    mask = m.weights[0].R_mask.clone()
    with pytest.raises(RuntimeError, match=r"Missing key\(s\) in state_dict: \"weights.0.R_mask\""):
        m.load_state_dict(dense.state_dict())
    m.load_state_dict(dense.state_dict(), strict=False)  # keeps the mask, R masked
    assert torch.equal(m.weights[0].R_mask, mask)
    assert torch.equal(m.weights[0].R.detach(), torch.where(mask, dense.weights[0].R, 0))


def test_pickling_and_deepcopy_keep_the_masks(tmp_path) -> None:
    m = layer(num_layers=2, bidirectional=True, sparsity=0.3)
    x = torch.randn(B, T, IN)
    want = m(x)
    torch.save(m, tmp_path / "m.pt")
    copies = [
        torch.load(tmp_path / "m.pt", weights_only=False),
        pickle.loads(pickle.dumps(m)),
        copy.deepcopy(m),
    ]
    for c in copies:
        assert all(torch.equal(a, b) for a, b in zip(masks(c), masks(m), strict=True))
        assert c.sparsity == 0.3
        torch.testing.assert_close(c(x), want, rtol=0, atol=0)


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_to_torch_holds_r_times_mask(bidirectional) -> None:
    m = layer(dtype=F64, num_layers=2, bidirectional=bidirectional, sparsity=0.4)
    smudge(m)
    theirs = m.to_torch()
    suffixes = ["_l0", "_l0_reverse", "_l1", "_l1_reverse"] if bidirectional else ["_l0", "_l1"]
    for w, sfx in zip(m.weights, suffixes, strict=True):
        weight_hh = getattr(theirs, f"weight_hh{sfx}").detach()
        assert torch.equal(weight_hh, torch.where(w.R_mask, w.R.detach(), 0).reshape(4 * H, H))
        assert (weight_hh.view(4, H, H)[~w.R_mask[:, 0]] == 0).all()
    x = x_of(m)
    out, last = m(x)
    out_t, (h, c) = theirs(x)
    torch.testing.assert_close(out, out_t, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(last, torch.stack([h, c]), rtol=1e-9, atol=1e-9)
    back = rnncc.RNN.from_torch(theirs)
    assert all(w.R_mask is None for w in back.weights) and back.sparsity is None


# ---- errors ------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [0, 0.0, -0.5, 1.5, True, "0.5", math.nan])
def test_density_out_of_range(bad) -> None:
    with pytest.raises(ValueError, match=r"^sparsity must be None \(dense\) or a density in"):
        layer(sparsity=bad)
    with pytest.raises(ValueError, match=r"^density must be a number in \(0, 1\]"):
        layer().prune_(bad)


def test_set_masks_errors() -> None:
    m = layer(num_layers=2)
    R0 = [w.R.detach().clone() for w in m.weights]
    ok = [torch.ones(w.R.shape, dtype=torch.bool) for w in m.weights]
    with pytest.raises(ValueError, match=r"^set_masks_ takes a list of 2 masks, .* got 1$"):
        m.set_masks_(ok[:1])
    with pytest.raises(ValueError, match=r"^set_masks_ takes a list of 2 masks, .* got a Tensor$"):
        m.set_masks_(ok[0])
    with pytest.raises(ValueError, match=r"^set_masks_ takes a list of 2 masks, .* got an int$"):
        m.set_masks_(5)  # type: ignore[arg-type]
    # densities of any real type: numpy's float32 and Fraction are no Python float
    import fractions

    import numpy as np

    for density in (np.float32(0.5), fractions.Fraction(1, 2)):
        twin = layer(num_layers=2).prune_(density)  # type: ignore[arg-type]
        assert torch.equal(
            twin.weights[0].R_mask, layer(num_layers=2).prune_(0.5).weights[0].R_mask
        )
    with pytest.raises(ValueError, match=r"^masks\[1\]: mask has shape \[4, 1, 6, 5\], expected"):
        m.set_masks_([ok[0], ok[1][..., :5]])
    with pytest.raises(ValueError, match=r"^masks\[0\]: mask has dtype torch.float32, expected"):
        m.set_masks_([ok[0].float(), ok[1]])
    with pytest.raises(ValueError, match=r"^masks\[1\]: mask must be a bool torch.Tensor"):
        m.set_masks_([ok[0], [[True]]])
    # nothing was set by a failing call
    assert all(w.R_mask is None for w in m.weights)
    assert all(torch.equal(w.R.detach(), r) for w, r in zip(m.weights, R0, strict=True))


@pytest.mark.parametrize("name", ["indrnn", "lru"])
def test_a_cell_without_r_has_nothing_to_prune(name) -> None:
    assert rnncc.load(EXAMPLES / f"{name}.rnn").gr_names == ()
    message = rf"cell '{name}' has no R \(no 'R h' term\) to make sparse"
    with pytest.raises(ValueError, match=message):
        layer(name, sparsity=0.5)
    with pytest.raises(ValueError, match="^prune_: " + message):
        layer(name).prune_(0.5)
    with pytest.raises(ValueError, match="^set_masks_: " + message):
        layer(name).set_masks_([])
