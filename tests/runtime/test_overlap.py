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
    """The reference backend's graph ends in torch's own nodes: they return dR themselves."""
    from rnncc.runtime.overlap import defer_r_gradient

    a = torch.randn(2, requires_grad=True)
    node = torch.cat([a, a]).grad_fn
    defer_r_gradient(node, {})  # no attribute to set on a C++ node: left alone
    assert not hasattr(node, "r_gradient_later")
