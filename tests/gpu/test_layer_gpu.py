"""``rnncc.RNN`` as nn.LSTM/GRU/RNN on the fused backend (``pytest -m gpu``): stacked,
bidirectional, padded and packed batches, initial states, autocast, in fp32 and bf16 at hidden
64, 12 heads × 64 and 768, against the same layer in float64 on the reference backend (outputs,
last states and the gradients of the input, the states and every weight). Padded, packed and
reverse-direction cases run the kernels built with per-row lengths (kTimeline)."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

import rnncc
from rnncc.errors import TilingError
from rnncc.testing import TOLERANCES, rel_err

pytestmark = pytest.mark.gpu

B, T, I = 4, 24, 32
LENGTHS = [17, 24, 3, 9]  # unsorted, one full row
#: (num_heads, hidden_size): one head of 64 (block tier), 12 × 64, one head of 768 (grid tier;
#: fp32 there as 3xTF32)
SIZES = [(1, 64), (12, 768), (1, 768)]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _cases():
    for cell in ("lstm", "gru", "elman"):
        for NH, H in SIZES:
            for dname in DTYPES:
                for num_layers in (1, 2):
                    for bidirectional in (False, True):
                        for how in ("full", "padded", "packed"):
                            yield pytest.param(
                                cell,
                                NH,
                                H,
                                dname,
                                num_layers,
                                bidirectional,
                                how,
                                id=f"{cell}-{NH}x{H // NH}-{dname}-L{num_layers}"
                                f"-{'bi' if bidirectional else 'uni'}-{how}",
                            )


def _layer(
    cell: str, NH: int, H: int, dtype: torch.dtype, run_dtype: torch.dtype | None = None, **kw
) -> rnncc.RNN:
    """The layer in ``dtype``, skipped where no fused kernel runs ``run_dtype`` (default
    ``dtype``) at this size."""
    torch.manual_seed(0)
    layer = rnncc.RNN(
        rnncc.load_builtin(cell), I, H, num_heads=NH, backend="fused", device="cuda", **kw
    )
    try:
        layer.cell.plan(B, NH, H // NH, run_dtype or dtype, backend="fused")
    except TilingError as err:
        pytest.skip(f"no fused kernel for {cell} at {NH} × {H // NH}: {err}")
    return layer.to(dtype)


def _reference(layer: rnncc.RNN) -> rnncc.RNN:
    """The same layer (its rounded weights) in float64 on the reference backend."""
    ref = copy.deepcopy(layer).double()
    ref.backend = "reference"
    return ref


def _run(layer, x, states, how):
    x = x.clone().requires_grad_()
    states = states.clone().requires_grad_()
    if how == "packed":
        inp = pack_padded_sequence(x, LENGTHS, batch_first=True, enforce_sorted=False)
        out, last = layer(inp, states)
        assert isinstance(out, PackedSequence)
        out = out.data
    else:
        out, last = layer(x, states, lengths=LENGTHS if how == "padded" else None)
    g = torch.Generator(device="cuda").manual_seed(1)
    cot_out = torch.randn(out.shape, generator=g, device="cuda", dtype=torch.float64)
    cot_last = torch.randn(last.shape, generator=g, device="cuda", dtype=torch.float64)
    loss = (out.double() * cot_out).sum() + (last.double() * cot_last).sum()
    loss.backward()
    grads = {"x": x.grad, "states": states.grad}
    grads.update({n: p.grad for n, p in layer.named_parameters()})
    return out, last, grads


@pytest.mark.parametrize(
    ("cell", "NH", "H", "dname", "num_layers", "bidirectional", "how"), list(_cases())
)
def test_layer_on_fused_matches_the_float64_reference(
    cell, NH, H, dname, num_layers, bidirectional, how
):
    dtype = DTYPES[dname]
    layer = _layer(cell, NH, H, dtype, num_layers=num_layers, bidirectional=bidirectional)
    ref = _reference(layer)
    S, K = len(layer.cell.state_names), num_layers * layer.num_directions
    x = torch.randn(B, T, I, device="cuda").to(dtype)
    states = (0.5 * torch.randn(S, K, B, H, device="cuda")).to(dtype)
    out, last, grads = _run(layer, x, states, how)
    assert layer.cell.last_backend == "fused"
    out_r, last_r, grads_r = _run(ref, x.double(), states.double(), how)
    tol = TOLERANCES[dtype]
    assert out.dtype == last.dtype == dtype
    errors = {"out": rel_err(out, out_r), "last": rel_err(last, last_r)}
    errors.update({f"d{k}": rel_err(grads[k], grads_r[k]) for k in grads_r})
    bad = {k: v for k, v in errors.items() if not v <= tol}
    assert not bad, f"relative errors above {tol}: {bad}"


@pytest.mark.parametrize(("NH", "H"), SIZES, ids=[f"{nh}x{h // nh}" for nh, h in SIZES])
def test_one_sequence_on_fused_matches_the_float64_reference(NH, H):
    """nn.LSTM's unbatched input, x [T, I]: a batch of one row on the fused kernels."""
    layer = _layer("lstm", NH, H, torch.bfloat16, num_layers=2, bidirectional=True)
    ref = _reference(layer)
    x = torch.randn(T, I, device="cuda")
    states = 0.5 * torch.randn(2, 4, H, device="cuda")
    results = []
    for module, dtype in ((layer, torch.bfloat16), (ref, torch.float64)):
        xg, sg = x.to(dtype).requires_grad_(), states.to(dtype).requires_grad_()
        out, last = module(xg, sg)
        assert out.shape == (T, 2 * H) and last.shape == (2, 4, H)
        (out.double().square().sum() + last.double().sum()).backward()
        results.append({"out": out, "last": last, "dx": xg.grad, "dstates": sg.grad})
        if module is layer:
            assert layer.cell.last_backend == "fused"
    tol = TOLERANCES[torch.bfloat16]
    errors = {k: rel_err(results[0][k], results[1][k]) for k in results[0]}
    assert all(v <= tol for v in errors.values()), errors


@pytest.mark.parametrize(("NH", "H"), SIZES, ids=[f"{nh}x{h // nh}" for nh, h in SIZES])
def test_autocast_bf16_with_fp32_weights(NH, H):
    """As nn.LSTM under autocast: the bf16 kernels run, the weights and their gradients stay
    float32, and the result is the layer with bf16-rounded weights."""
    layer = _layer("lstm", NH, H, torch.float32, torch.bfloat16)
    x = torch.randn(B, T, I, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out, last = layer(x)
    assert out.dtype == last.dtype == torch.bfloat16 and layer.cell.last_backend == "fused"
    (out.float().square().sum() + last.float().sum()).backward()
    assert all(p.grad.dtype == torch.float32 for p in layer.parameters())
    ref = _reference(copy.deepcopy(layer).bfloat16())
    out_r, last_r = ref(x.bfloat16().double())
    tol = TOLERANCES[torch.bfloat16]
    assert rel_err(out, out_r) <= tol and rel_err(last, last_r) <= tol


@pytest.mark.parametrize(
    "module",
    [
        pytest.param(lambda: nn.LSTM(I, 64, batch_first=True), id="lstm"),
        pytest.param(lambda: nn.GRU(I, 64, batch_first=True), id="gru"),
        pytest.param(lambda: nn.RNN(I, 64, batch_first=True), id="rnn_tanh"),
        pytest.param(lambda: nn.RNN(I, 64, batch_first=True, nonlinearity="relu"), id="rnn_relu"),
        pytest.param(
            lambda: nn.LSTM(I, 64, num_layers=2, bidirectional=True, batch_first=True),
            id="lstm-2-bi",
        ),
    ],
)
def test_from_torch_on_fused_matches_torch(module):
    torch.manual_seed(0)
    theirs = module().cuda()
    ours = rnncc.RNN.from_torch(theirs, backend="fused")
    x = torch.randn(B, T, I, device="cuda")
    out, last = ours(x)
    assert ours.cell.last_backend == "fused"
    with torch.no_grad():
        out_t, last_t = theirs.double()(x.double())
    last_t = torch.stack(last_t) if isinstance(last_t, tuple) else last_t[None]
    tol = TOLERANCES[torch.float32]
    assert rel_err(out, out_t) <= tol and rel_err(last, last_t) <= tol


def test_a_fused_size_that_does_not_fit_says_so():
    with pytest.raises(TilingError, match="no fused kernel for head dim 1536"):
        rnncc.RNN(rnncc.load_builtin("lstm"), I, 1536, backend="fused", device="cuda")(
            torch.randn(B, T, I, device="cuda")
        )


@contextlib.contextmanager
def _no_synchronisation():
    """Raise on any host synchronisation inside (torch's sync debug mode), the GPU idle
    before."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.parametrize("how", ["full", "padded", "packed", "pruned"])
def test_a_training_step_does_not_wait_for_the_gpu(how):
    """A call and its backward make no host synchronisation, so that a training loop's host
    queues the next step while the GPU runs this one: torch's sync debug mode raises on any
    (a packed batch's sort order is on the GPU; reading it there would wait; a pruned layer's
    mask is measured once, at its first call)."""
    layer = _layer("lstm", 1, 64, torch.bfloat16, num_layers=2, bidirectional=True)
    if how == "pruned":
        layer.prune_(0.5)
    x = torch.randn(B, T, I, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    # packed here: packing copies the sort order to the GPU from pageable memory, which waits
    packed = pack_padded_sequence(x, LENGTHS, batch_first=True, enforce_sorted=False)

    def step():
        if how == "packed":
            out = layer(packed)[0].data
        else:
            out = layer(x, lengths=LENGTHS if how == "padded" else None)[0]
        out.float().sum().backward(retain_graph=how == "packed")

    step()  # the first call builds and plans
    with _no_synchronisation():
        step()
    assert layer.cell.last_backend == "fused"


def test_decoding_steps_do_not_wait_for_the_gpu():
    """``layer.step`` under ``no_grad`` (the decoding kernel, one launch a layer) makes no host
    synchronisation either: a decoding loop's host stays ahead of the GPU."""
    layer = _layer("lstm", 1, 64, torch.bfloat16, num_layers=2)
    x_t = torch.randn(B, I, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        _, states = layer.step(x_t)  # the first step builds
        with _no_synchronisation():
            for _ in range(3):
                _, states = layer.step(x_t, states)
    assert states.shape == (2, 2, B, 64)


@pytest.mark.parametrize("how", ["bf16", "autocast", "stepwise"])
def test_upper_layers_weight_gradients_on_a_second_stream_are_the_one_stream_bits(monkeypatch, how):
    """Layers above the first make their input projection's weight gradients and R's on a
    second CUDA stream (``rnncc/runtime/overlap.py``), beside the lower layer's backward: the
    same bits as on one stream, accumulated over two backward calls, whole in a
    post-accumulate hook, also under autocast with float32 weights and on the stepwise
    backend (whose backward defers R's gradient too)."""
    from rnncc.runtime import module, overlap

    dtype = torch.float32 if how == "autocast" else torch.bfloat16
    layer = _layer("lstm", 1, 64, dtype, torch.bfloat16, num_layers=3, bidirectional=True)
    if how == "stepwise":
        layer.backend = "stepwise"
    x = torch.randn(B, T, I, device="cuda", dtype=dtype)
    upper = layer.weights[2].input_proj.weight  # the second layer's forward direction
    seen: list[torch.Tensor] = []
    upper.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.clone()))
    upper_r = layer.weights[2].R
    seen_r: list[torch.Tensor] = []
    upper_r.register_post_accumulate_grad_hook(lambda p: seen_r.append(p.grad.clone()))
    streams, r_streams = [], []
    made, made_r = overlap._WeightGradients.backward, overlap._RGradient.backward

    def counted(ctx, g):
        streams.append(torch.cuda.current_stream())
        return made(ctx, g)

    def counted_r(ctx, g):
        r_streams.append(torch.cuda.current_stream())
        return made_r(ctx, g)

    monkeypatch.setattr(overlap._WeightGradients, "backward", staticmethod(counted))
    monkeypatch.setattr(overlap._RGradient, "backward", staticmethod(counted_r))

    def grads():
        layer.zero_grad(set_to_none=True)
        xg = x.clone().requires_grad_()
        for _ in range(2):  # the second backward accumulates into the first's gradients
            with torch.autocast("cuda", torch.bfloat16, enabled=how == "autocast"):
                out, last = layer(xg)
            (out.float().square().sum() + last.float().sum()).backward()
        return [xg.grad, *(p.grad for p in layer.parameters())]

    beside = grads()
    side = overlap.side_stream(x.device)
    assert len(streams) == 2 * 2 and all(s == side for s in streams)  # layers 2, 3; twice
    assert side != torch.cuda.current_stream()
    assert len(seen) == 2 and torch.equal(seen[-1], upper.grad)
    assert len(r_streams) == 2 * 2 and all(s == side for s in r_streams)
    assert len(seen_r) == 2 and torch.equal(seen_r[-1], upper_r.grad)
    monkeypatch.setattr(module, "beside", lambda x: False)
    one_stream = grads()
    assert len(streams) == 4 and len(r_streams) == 4  # not again
    assert all(g.dtype == dtype for g in beside[1:])
    assert all(torch.equal(a, b) for a, b in zip(beside, one_stream, strict=True))


def test_a_unidirectional_layer_s_r_gradient_stays_on_the_caller_s_stream(monkeypatch):
    """A unidirectional layer in its weights' dtype takes its R parameter as it is (nothing
    made on the second stream to accumulate through): the one-stream gradients."""
    from rnncc.runtime import module, overlap

    layer = _layer("lstm", 1, 64, torch.float32, num_layers=2)
    x = torch.randn(B, T, I, device="cuda")
    r_calls = []
    made_r = overlap._RGradient.backward
    monkeypatch.setattr(
        overlap._RGradient, "backward", staticmethod(lambda c, g: r_calls.append(1) or made_r(c, g))
    )

    def grads():
        layer.zero_grad(set_to_none=True)
        xg = x.clone().requires_grad_()
        out, last = layer(xg)
        (out.square().sum() + last.sum()).backward()
        return [xg.grad, *(p.grad for p in layer.parameters())]

    beside = grads()
    assert layer.cell.last_backend == "fused" and not r_calls
    monkeypatch.setattr(module, "beside", lambda x: False)
    assert all(torch.equal(a, b) for a, b in zip(beside, grads(), strict=True))


def test_the_reference_backend_keeps_one_stream_and_its_second_order(monkeypatch):
    """On CUDA the reference backend's backward is differentiable again, which the second
    stream's Functions are not: its stacks keep one stream, and a gradient penalty reaches
    the upper layer's input projection."""
    from rnncc.runtime import module

    layer = _layer("lstm", 1, 16, torch.float32, num_layers=2, bidirectional=True)
    layer.backend = "reference"
    monkeypatch.setattr(module, "project_beside", None)  # called: a TypeError
    monkeypatch.setattr(module, "recurrent_beside", None)
    x = torch.randn(B, 5, I, device="cuda", requires_grad=True)
    out, _ = layer(x)
    (dx,) = torch.autograd.grad(out.square().sum(), x, create_graph=True)
    dx.square().sum().backward()
    assert layer.cell.last_backend == "reference"
    assert layer.weights[2].input_proj.weight.grad.abs().sum() > 0
