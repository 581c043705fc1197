"""The rule for a layer's weight gradients on a second CUDA stream (``rnncc/runtime/overlap.py``);
the stream itself runs in tests/gpu/test_layer_gpu.py."""

from __future__ import annotations

import torch

from rnncc.runtime.overlap import beside


def test_only_cuda_tensors_recording_gradients_go_beside():
    x = torch.randn(2, 3, requires_grad=True)
    assert not beside(x)  # on the CPU
    assert not beside(x.detach())


def test_torch_has_the_hold_the_side_stream_starts_with():
    # beside() is False without torch.cuda._sleep: a torch that drops it runs one stream
    assert callable(getattr(torch.cuda, "_sleep", None))


def test_r_gradient_defers_only_through_a_kernel_op_s_context():
    """A torch node (not a kernel op's context) returns dR itself: nothing is set on it."""
    from rnncc.runtime.overlap import defer_r_gradient

    a = torch.randn(2, requires_grad=True)
    node = torch.cat([a, a]).grad_fn
    defer_r_gradient(node, {})  # no attribute to set on a C++ node: left alone
    assert not hasattr(node, "r_gradient_later")


def test_the_projection_beside_is_first_order_only():
    """Differentiated again (a gradient penalty), the side stream's projection raises rather
    than drop W's path: only CUDA kernels, whose backward is first order too, take it."""
    import pytest

    from rnncc.runtime.overlap import _Projection

    x = torch.randn(5, 3, requires_grad=True)
    W = torch.randn(4, 3, requires_grad=True)
    token = torch.zeros(()).expand(5, 4).requires_grad_()
    out = _Projection.apply(x, W, None, token, None)
    (dx,) = torch.autograd.grad(out.square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="marked with @once_differentiable"):
        dx.square().sum().backward()


def test_a_stack_on_the_reference_backend_keeps_one_stream(monkeypatch):
    """Even where beside() says yes, a layer whose cell runs on the reference backend (or in
    float64, which only it runs) uses none of the second stream's Functions, whose backward
    is first order: its gradient penalties reach every weight."""
    import rnncc
    from rnncc.runtime import module

    monkeypatch.setattr(module, "beside", lambda x: True)
    for name in ("join_after", "project_beside", "recurrent_beside"):
        monkeypatch.setattr(module, name, None)  # called: a TypeError
    cell = rnncc.load_builtin("lstm")
    for backend, dtype in (("reference", torch.float32), ("auto", torch.float64)):
        torch.manual_seed(0)
        layer = rnncc.RNN(cell, 3, 4, num_layers=2, bidirectional=True, backend=backend)
        layer = layer.to(dtype)
        x = torch.randn(2, 5, 3, dtype=dtype, requires_grad=True)
        (dx,) = torch.autograd.grad(layer(x)[0].square().sum(), x, create_graph=True)
        dx.square().sum().backward()
        assert layer.weights[2].input_proj.weight.grad.abs().sum() > 0


def test_a_process_group_keeps_one_stream(monkeypatch):
    """DDP holds each parameter's accumulation node on the caller's stream from its
    construction: where torch.distributed is initialised, no second stream."""
    import torch.distributed as dist

    from rnncc.runtime.overlap import in_process_group

    assert not in_process_group()
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    assert in_process_group() == dist.is_available()
