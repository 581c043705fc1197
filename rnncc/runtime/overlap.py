"""The input projection of a stacked layer above the first, its weight gradients made on a second
CUDA stream.

In a stack's backward nothing below layer l needs the gradients of layer l's input projection
(``W`` and ``b``): they are a GEMM and a sum over every (row, step), about 0.4 ms for a
bidirectional layer of 768 units at B = 16, T = 1024 on an H200. On one stream they run between
layer l's recurrent backward kernel and layer l-1's, which leaves a third of the SMs idle for
4 ms. Here the weights are stacked and cast under a second stream and a Function made there
(``_WeightGradients``) takes the projection's output gradient through a zero-stride token, so
autograd runs that Function's backward, the stacking's backward and the weights' gradient
accumulation on that stream, beside the recurrent kernel. The caller's stream waits for it once
the lower layer's recurrent backward is queued (a hook on that op's node), so every gradient
accumulated later is ordered after these (``backward()`` would join the streams only at its
end: autograd syncs the streams of the leaves it accumulated into). The projection itself
(``_Projection``) and its input gradient stay on the caller's stream. Outputs and gradients
are the same bits as ``nn.functional.linear``'s.

The side stream first holds for about 20 µs (``torch.cuda._sleep``): started at once, the GEMM
takes every SM before the lower layer's cooperative recurrent kernel is launched, and that kernel
then waits for it. The hold lets the kernel take its SMs first and the GEMM fill the others.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rnncc.runtime.api import _may_keep

#: The side stream's hold before the weight gradients, in GPU clock cycles (about 20 µs at 2 GHz):
#: longer than the caller's stream takes from the projection's input gradient to the lower
#: layer's recurrent kernel (tens of µs: the output's permute and the op's copies).
HOLD_CYCLES = 40_000

_side: dict[int, torch.cuda.Stream] = {}

Weights = tuple[torch.Tensor, torch.Tensor | None]


def beside(x: torch.Tensor) -> bool:
    """Whether a layer's projection of ``x`` (the layer below's output) makes its weight
    gradients on the side stream: on CUDA, in eager mode (not while torch.compile traces, a
    dispatch mode runs or a CUDA graph captures), recording gradients, and only where ``x``
    requires grad, so that a lower layer's backward follows to run beside."""
    return (
        x.is_cuda
        and x.requires_grad
        and torch.is_grad_enabled()
        and _may_keep(True)
        and hasattr(torch.cuda, "_sleep")
    )


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """The weight gradients' stream of ``device`` (one per device, made on first use)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = _side.get(index)
    if stream is None:
        stream = _side[index] = torch.cuda.Stream(index)
    return stream


def project_beside(
    x: torch.Tensor, weights: Callable[[], Weights], below: torch.autograd.graph.Node
) -> torch.Tensor:
    """``x @ weight.T + bias`` for ``x`` ``[N, I]``, with ``(weight, bias) = weights()`` made on
    the side stream (so are their gradients, see the module's docstring). ``below``: the
    autograd node of the layer below's recurrent op; once its backward is queued (its
    recurrent kernel launched), the caller's stream waits for the side stream. Every
    gradient accumulated after it is then ordered after this layer's, as DDP needs: its
    hooks copy each gradient into a bucket on the stream they run on, and reduce a bucket on
    the stream of the hook that completes it."""
    device = x.device
    main = torch.cuda.current_stream(device)
    side = side_stream(device)

    def join(*_: object) -> None:  # on the stream autograd runs that node's backward on
        torch.cuda.current_stream(device).wait_stream(side)

    below.register_hook(join)
    side.wait_stream(main)  # the parameters as the caller's stream last wrote them
    with torch.cuda.stream(side):
        weight, bias = weights()
        token = _WeightGradients.apply(x.detach(), weight, bias)
    main.wait_stream(side)
    for t in (weight, bias):
        if t is not None:
            t.record_stream(main)  # made on the side stream, read on this one
    out: torch.Tensor = _Projection.apply(
        x, weight.detach(), None if bias is None else bias.detach(), token
    )
    return out


class _WeightGradients(torch.autograd.Function):
    """Made on the side stream: its output, a zero-stride token ``[N, G]``, receives the
    projection's output gradient, from which its backward (run on that stream) makes
    ``weight``'s and ``bias``'s."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
    ) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.has_bias = bias is not None  # type: ignore[attr-defined]
        return x.new_zeros(()).expand(x.shape[0], weight.shape[0])

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, g: torch.Tensor
    ) -> tuple[None, torch.Tensor | None, torch.Tensor | None]:
        (x,) = ctx.saved_tensors  # type: ignore[attr-defined]
        stream = torch.cuda.current_stream(g.device)
        g.record_stream(stream)  # both made on the caller's stream
        x.record_stream(stream)
        torch.cuda._sleep(HOLD_CYCLES)
        needs = ctx.needs_input_grad  # type: ignore[attr-defined]
        dW = g.t().mm(x) if needs[1] else None
        db = g.sum(0) if ctx.has_bias and needs[2] else None  # type: ignore[attr-defined]
        return None, dW, db


class _Projection(torch.autograd.Function):
    """The projection on the caller's stream, from the detached weights; its backward makes the
    input's gradient and hands the output's to the token."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        token: torch.Tensor,
    ) -> torch.Tensor:
        ctx.save_for_backward(weight)
        return x.mm(weight.t()) if bias is None else torch.addmm(bias, x, weight.t())

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, g: torch.Tensor
    ) -> tuple[torch.Tensor | None, None, None, torch.Tensor]:
        (weight,) = ctx.saved_tensors  # type: ignore[attr-defined]
        dx = g.mm(weight) if ctx.needs_input_grad[0] else None  # type: ignore[attr-defined]
        return dx, None, None, g
