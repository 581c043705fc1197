"""The runtime's backends on a GPU (``pytest -m gpu``): the automatic choice and its warning,
torch.compile(fullgraph=True) and CUDA-graph capture of forward + backward, default states per
stream, cotangents of unused outputs, unaligned views, empty sequences — for the stepwise and
the fused variants."""

from __future__ import annotations

import pytest
import torch
from gpu_reference import EXAMPLES, INPUTS, load_examples

import rnncc
from rnncc.testing import random_inputs, rel_err

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cells():
    loaded = load_examples()
    lstm = loaded["lstm"]
    for dtype, D in ((torch.float32, 16), (torch.bfloat16, 16), (torch.float32, 32)):
        lstm.prepare("cuda", head_dim=D, dtype=dtype)
    return loaded


def test_auto_picks_fused_where_it_fits_else_stepwise_and_warns_once(cells):
    cell = rnncc.load(next(p for p in EXAMPLES if p.stem == "gru"))
    small = {
        k: None if v is None else v.cuda().float()
        for k, v in random_inputs(cell.ir, 2, 3, 1, 8).items()
    }
    cell(*(small[k] for k in INPUTS))
    assert cell.last_backend == "fused"
    grid = {  # float32 past the block tier: the grid tier's 3xTF32 blocks
        k: None if v is None else v.cuda().float()
        for k, v in random_inputs(cell.ir, 2, 3, 1, 80).items()
    }
    cell(*(grid[k] for k in INPUTS))
    assert cell.last_backend == "fused" and cell.last_plan.variant == "grid_mma"
    x = {  # and past its 1024 units, no fused variant
        k: None if v is None else v.cuda().float()
        for k, v in random_inputs(cell.ir, 2, 3, 1, 1040).items()
    }
    with pytest.warns(rnncc.RnnccWarning, match="stepwise"):
        cell(*(x[k] for k in INPUTS))
    assert cell.last_backend == "stepwise"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cell(*(x[k] for k in INPUTS))


def _model(cells, backend):
    torch.manual_seed(0)
    if backend == "fused-grid":  # one head of 256 units in bf16: the grid tier
        return rnncc.RNN(cells["lstm"], 12, 256, backend="fused").cuda().bfloat16()
    return rnncc.RNN(cells["lstm"], 12, 32, num_heads=2, backend=backend).cuda()


def _input(model):
    return torch.randn(3, 11, 12, device="cuda").to(next(model.parameters()).dtype)


@pytest.mark.parametrize("backend", ["stepwise", "fused"])
def test_torch_compile_fullgraph_matches_eager(cells, backend):
    model = _model(cells, backend)
    x = _input(model)
    out, last = model(x)
    (out.sum() + last.sum()).backward()
    eager = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled = torch.compile(model, fullgraph=True)
    out_c, last_c = compiled(x)
    (out_c.sum() + last_c.sum()).backward()
    assert rel_err(out_c, out) <= 1e-6 and rel_err(last_c, last) <= 1e-6
    for p, g in zip(model.parameters(), eager, strict=True):
        assert rel_err(p.grad, g) <= 1e-6


@pytest.mark.parametrize("backend", ["stepwise", "fused", "fused-grid"])
def test_cuda_graph_capture_of_forward_and_backward(cells, backend):
    model = _model(cells, backend)
    x = _input(model)
    out, last = model(x)
    (out.sum() + last.sum()).backward()
    eager_out = out.detach().clone()
    eager = [p.grad.clone() for p in model.parameters()]
    # Drop the eager graph: its AccumulateGrad nodes belong to the default stream, and a
    # capture that reuses them would make the legacy stream wait on the capture.
    del out, last

    static_x = x.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm up outside the capture
            model.zero_grad(set_to_none=True)
            o, l = model(static_x)
            (o.sum() + l.sum()).backward()
        del o, l
    torch.cuda.current_stream().wait_stream(stream)
    model.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out, static_last = model(static_x)
        (static_out.sum() + static_last.sum()).backward()
    static_x.copy_(x)
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(static_out, eager_out) <= 1e-6
    for p, g in zip(model.parameters(), eager, strict=True):
        assert rel_err(p.grad, g) <= 1e-6


def test_default_states_are_kept_per_stream_and_never_in_a_capture(cells):
    """The declared initial states a call fills in are kept per CUDA stream (a tensor filled on
    one stream is not read on another), and neither made nor kept while a stream captures."""
    cell = cells["lstm"]
    x = random_inputs(cell.ir, 3, 5, 2, 16, seed=4)
    Wx, R, b = (x[k].to("cuda", torch.bfloat16) for k in ("Wx", "R", "b"))
    cell._defaults.clear()
    y, _ = cell(Wx, R, b, backend="fused")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y_side, _ = cell(Wx, R, b, backend="fused")
    torch.cuda.current_stream().wait_stream(side)
    assert len(cell._defaults) == 2 and torch.equal(y_side, y)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_graph, _ = cell(Wx, R, b, backend="fused")
    assert len(cell._defaults) == 2
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y_graph, y)


@pytest.mark.parametrize("backend", ["stepwise", "fused"])
@pytest.mark.parametrize("used", ["y", "last"])
def test_a_loss_of_one_output_gets_the_gradients_of_a_zero_cotangent_for_the_other(
    cells, backend, used
):
    """Autograd passes no cotangent for an output the loss does not use (nor for the saved
    history): the backward fills in zeros itself, with the same gradients as explicit zeros."""
    cell = cells["lstm"]
    x = {
        k: None if v is None else v.cuda().to(torch.bfloat16)
        for k, v in random_inputs(cell.ir, 3, 9, 2, 16).items()
    }
    grads = []
    for explicit in (False, True):
        ins = {k: None if v is None else v.clone().requires_grad_() for k, v in x.items()}
        y, last = cell(*(ins[k] for k in INPUTS), backend=backend)
        loss = (y if used == "y" else last).float().sum()
        if explicit:
            loss = loss + 0 * (last if used == "y" else y).float().sum()
        loss.backward()
        grads.append([ins[k].grad for k in INPUTS if ins[k] is not None])
    for got, want in zip(*grads, strict=True):
        assert got is not None and torch.equal(got, want)


def test_fused_reads_a_view_that_starts_unaligned(cells):
    """The tensor-core kernels read two adjacent elements per access: a contiguous view whose
    data starts at an odd element is copied by the host, not read misaligned."""
    cell = cells["lstm"]
    x = {
        k: None if v is None else v.cuda().to(torch.bfloat16)
        for k, v in random_inputs(cell.ir, 3, 5, 2, 16).items()
    }
    storage = torch.empty(x["Wx"].numel() + 1, device="cuda", dtype=torch.bfloat16)
    shifted = storage[1:].view(x["Wx"].shape)
    shifted.copy_(x["Wx"])
    assert shifted.is_contiguous() and shifted.data_ptr() % 4 != 0
    ins = {**x, "Wx": shifted.requires_grad_()}
    y, last = cell(*(ins[k] for k in INPUTS), backend="fused")
    (y.float().sum() + last.float().sum()).backward()
    ref = {**x, "Wx": x["Wx"].clone().requires_grad_()}
    y_ref, last_ref = cell(*(ref[k] for k in INPUTS), backend="fused")
    (y_ref.float().sum() + last_ref.float().sum()).backward()
    assert torch.equal(y, y_ref) and torch.equal(last, last_ref)
    assert torch.equal(ins["Wx"].grad, ref["Wx"].grad)


@pytest.mark.parametrize("backend", ["stepwise", "fused"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_empty_sequence_returns_the_initial_states(cells, backend, dtype):
    cell = cells["lstm"]
    x = {
        k: None if v is None else v.cuda().to(dtype)
        for k, v in random_inputs(cell.ir, 3, 0, 2, 16).items()
    }
    y, last = cell(*(x[k] for k in INPUTS), backend=backend)
    assert y.shape[2] == 0 and torch.equal(last, x["states"])


@pytest.mark.parametrize("dtype, D", [(torch.bfloat16, 16), (torch.float32, 32)])
def test_repeated_calls_keep_their_plan_and_a_no_grad_call_runs_the_same_kernels(
    cells, monkeypatch, dtype, D
):
    """A cell keeps a call's plan by (backend, device, dtype, B, NH, D): the second call plans
    nothing. A call with nothing to differentiate runs the op's CUDA implementation
    directly; its outputs are bit-identical to a call that records autograd."""
    cell = cells["lstm"]
    x = random_inputs(cell.ir, 4, 3, 2, D, seed=1)
    args = [None if x[k] is None else x[k].to("cuda", dtype) for k in INPUTS]
    first = cell(*args, backend="fused")
    planned = []
    real = cell._choose
    monkeypatch.setattr(cell, "_choose", lambda *a, **k: planned.append(a) or real(*a, **k))
    with torch.no_grad():
        y, last = cell(*args, backend="fused")
    R = args[1].clone().requires_grad_()
    y_grad, last_grad = cell(args[0], R, *args[2:], backend="fused")
    assert planned == [] and cell.last_backend == "fused"
    assert torch.equal(y, first[0]) and torch.equal(last, first[1])
    assert torch.equal(y, y_grad) and torch.equal(last, last_grad) and y_grad.requires_grad
