"""A stacked layer above the first: the gradients of its input projection's weights and of its
recurrent weights made on a second CUDA stream.

In a stack's backward nothing below layer l needs the gradients of layer l's weights: ``W``'s
and ``b``'s are a GEMM and a sum over every (row, step), ``R``'s a batched GEMM over every step,
about 0.4 and 0.2 ms for a bidirectional layer of 768 units at B = 16, T = 1024 on an H200. On
one stream they run between layer l's recurrent backward kernel and layer l-1's, which leaves a
third of the SMs idle for 4 ms. Here they run on a second stream, beside that kernel:

- The projection's weights are stacked and cast on it, and a Function made there
  (``_WeightGradients``) takes the projection's output gradient through a zero-stride token,
  so autograd runs that Function's backward, the stacking's backward and the weights'
  gradient accumulation on that stream. The projection itself (``_Projection``) and its input
  gradient stay on the caller's stream.
- The directions' ``R`` are joined and cast on it too (``recurrent_beside``); the cell op's
  backward leaves its gate cotangents in place of ``dR`` (``defer_r_gradient``), and a
  Function made there (``_RGradient``), whose token the projection takes, makes ``dR`` from
  them on that stream once the projection's backward is queued; the join's backward and the
  accumulation then run there too.

These Functions' backwards are first order (they raise when differentiated again), as the cell
op's is on the CUDA backends, the only ones they serve: a layer whose cell runs on the reference
backend, whose backward is differentiable again, keeps one stream.

The caller's stream waits for the second stream once the lower layer's recurrent backward is
queued (``join_after``: a hook on that op's node), so every gradient accumulated later is
ordered after these (``backward()`` would join the streams only at its end: autograd syncs the
streams of the leaves it accumulated into). Outputs and gradients are the same bits as on one
stream.

The side stream first holds for about 20 µs (``torch.cuda._sleep``): started at once, the GEMM
takes every SM before the lower layer's cooperative recurrent kernel is launched, and that kernel
then waits for it. The hold lets the kernel take its SMs first and the GEMM fill the others.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch.autograd.function import once_differentiable

from rnncc.runtime.api import _may_keep

#: The side stream's hold before the weight gradients, in GPU clock cycles (about 20 µs at 2 GHz):
#: longer than the caller's stream takes from the projection's input gradient to the lower
#: layer's recurrent kernel (tens of µs: the output's permute and the op's copies).
HOLD_CYCLES = 40_000

_side: dict[int, torch.cuda.Stream] = {}

Weights = tuple[torch.Tensor, torch.Tensor | None]
_T = TypeVar("_T")


def beside(x: torch.Tensor) -> bool:
    """Whether a layer's projection of ``x`` (the layer below's output) makes its weight
    gradients on the side stream: on CUDA, in eager mode (not while torch.compile traces, a
    dispatch mode runs or a CUDA graph captures), recording gradients, only where ``x``
    requires grad, so that a lower layer's backward follows to run beside, and outside a
    process group (``in_process_group``)."""
    return (
        x.is_cuda
        and x.requires_grad
        and torch.is_grad_enabled()
        and _may_keep(True)
        and hasattr(torch.cuda, "_sleep")
        and not in_process_group()
    )


def in_process_group() -> bool:
    """Whether this process has initialised ``torch.distributed``. DDP keeps each parameter's
    gradient accumulation node from its construction, made on the caller's stream; autograd
    then accumulates a gradient made on the side stream there, after waiting for it (no
    overlap), and warns of the mismatch on every backward."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """The weight gradients' stream of ``device`` (one per device, made on first use)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = _side.get(index)
    if stream is None:
        stream = _side[index] = torch.cuda.Stream(index)
    return stream


def join_after(below: torch.autograd.graph.Node, device: torch.device) -> None:
    """Once the backward of ``below`` (the autograd node of the layer below's recurrent op) is
    queued, its recurrent kernel launched, the caller's stream waits for the side stream.
    Every gradient accumulated after it is then ordered after this layer's, as DDP needs: its
    hooks copy each gradient into a bucket on the stream they run on, and reduce a bucket on
    the stream of the hook that completes it."""
    side = side_stream(device)

    def join(*_: object) -> None:  # on the stream autograd runs that node's backward on
        torch.cuda.current_stream(device).wait_stream(side)

    below.register_hook(join)


def made_beside(device: torch.device, make: Callable[[], _T]) -> _T:
    """``make()`` (a tensor, or a tuple of tensors and Nones) run on the side stream, after the
    caller's stream's work so far (the parameters as it last wrote them), and the caller's
    stream then waiting for it: the results' autograd nodes, so their backward and the
    accumulation into the parameters, belong to the side stream."""
    main = torch.cuda.current_stream(device)
    side = side_stream(device)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        made = make()
    main.wait_stream(side)
    for t in made if isinstance(made, tuple) else (made,):
        if isinstance(t, torch.Tensor):
            t.record_stream(main)  # made on the side stream, read on this one
    return made


def project_beside(
    x: torch.Tensor, weights: Callable[[], Weights], r_token: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ weight.T + bias`` for ``x`` ``[N, I]``, with ``(weight, bias) = weights()`` made on
    the side stream, and so their gradients (see the module's docstring; the caller joins the
    streams with ``join_after``). ``r_token``: ``recurrent_beside``'s, whose backward then
    follows this projection's."""

    def made() -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        weight, bias = weights()
        return weight, bias, _WeightGradients.apply(x.detach(), weight, bias)

    weight, bias, token = made_beside(x.device, made)
    out: torch.Tensor = _Projection.apply(
        x, weight.detach(), None if bias is None else bias.detach(), token, r_token
    )
    return out


def recurrent_beside(
    device: torch.device, make: Callable[[], torch.Tensor | None]
) -> tuple[torch.Tensor | None, torch.Tensor | None, dict[str, object] | None]:
    """``R = make()`` (the directions' recurrent weights, joined and cast) made on the side
    stream, and where ``R`` is an op's result (not a parameter itself, whose accumulation
    keeps the stream autograd gives it), ``(R, token, later)``: the cell op's backward leaves
    its gate cotangents in ``later`` (``defer_r_gradient``) and returns no gradient for ``R``;
    the projection takes ``token`` (``project_beside``), whose backward (``_RGradient``, on
    the side stream once the projection's backward, the input gradient's GEMM, is queued)
    makes ``dR`` from them. Else ``(R, None, None)``."""
    later: dict[str, object] = {}

    def made() -> tuple[torch.Tensor | None, torch.Tensor | None]:
        R = make()
        if R is None or R.grad_fn is None:
            return R, None
        return R, _RGradient.apply(R, later)

    R, token = made_beside(device, made)
    return R, token, None if token is None else later


def defer_r_gradient(op: torch.autograd.graph.Node, later: dict[str, object]) -> None:
    """Have a kernel's cell op, whose autograd node ``op`` is its context (the eager path's
    ``torch.autograd.Function``, ``rnncc/runtime/kernels.py``), leave ``R``'s gradient in
    ``later`` rather than return it: its gate cotangents where its backward defers ``dR``
    (``later["G"]``), else ``dR`` itself (``later["dR"]``); ``_RGradient`` takes it from
    there. Any other ``op`` (a torch node: none reaches here while the layer plans kernels)
    returns ``dR`` itself, and ``later`` stays empty."""
    if hasattr(op, "r_gradient_later"):
        op.r_gradient_later = later


class _RGradient(torch.autograd.Function):
    """Made on the side stream from ``R``: a scalar token the projection takes, so that its
    backward runs on that stream after the projection's, and makes ``dR`` from what the cell
    op's backward left in ``later`` (``defer_r_gradient``)."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx, R: torch.Tensor, later: dict[str, object]
    ) -> torch.Tensor:
        ctx.later = later  # type: ignore[attr-defined]
        return R.new_zeros(())

    @staticmethod
    @once_differentiable
    def backward(ctx: torch.autograd.function.FunctionCtx, _: torch.Tensor) -> tuple[Any, None]:
        later: dict[str, Any] = ctx.later  # type: ignore[attr-defined]
        if "G" not in later:
            return later.pop("dR", None), None
        G, hist, dims = later.pop("G")
        stream = torch.cuda.current_stream(G.device)
        G.record_stream(stream)  # both made on the caller's stream
        hist.record_stream(stream)
        torch.cuda._sleep(HOLD_CYCLES)
        return torch.ops.rnncc_host.r_gradient(G, hist, dims), None


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
    @once_differentiable
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
        r_token: torch.Tensor | None,
    ) -> torch.Tensor:
        ctx.save_for_backward(weight)
        return x.mm(weight.t()) if bias is None else torch.addmm(bias, x, weight.t())

    @staticmethod
    @once_differentiable
    def backward(
        ctx: torch.autograd.function.FunctionCtx, g: torch.Tensor
    ) -> tuple[torch.Tensor | None, None, None, torch.Tensor, torch.Tensor | None]:
        (weight,) = ctx.saved_tensors  # type: ignore[attr-defined]
        needs = ctx.needs_input_grad  # type: ignore[attr-defined]
        dx = g.mm(weight) if needs[0] else None
        return dx, None, None, g, g.new_zeros(()) if needs[4] else None
