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
