"""Input validation for a cell call: shapes, dtypes, devices, with messages a user can act on.

Input: the tensors of ``cell(Wx, R, b, states, params)`` and the cell IR. Output: the sizes
``(B, T, NH, D)``; or ``ValueError`` naming the tensor, the expected and the actual shape (or
dtype, or device). The shapes a call takes (README, "Use it from PyTorch"):

    Wx [B, T, Gx, NH, D]   R [Gr, NH, D, D]   b [Gb, NH, D]
    states [S, B, NH, D]   params [P, NH, D]   lengths [B] (integers in 1..T, any device)
    reverse: a bool, or NH bools (one per head) reversing the last heads
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import NamedTuple, NoReturn

import torch

from rnncc.ir.cell import Cell

#: Whether a torch.func transform is active (a private torch function; without it, never).
functorch_active: Callable[[], bool] = getattr(
    torch._C, "_are_functorch_transforms_active", lambda: False
)


def autocast_on(device_type: str) -> bool:
    """Whether autocast is on for ``device_type``; False on ``meta``, which has no autocast (its
    ``is_autocast_enabled`` raises). Not ``torch.amp.is_autocast_available``: torch.compile
    cannot trace it, and a ``fullgraph=True`` compile of a layer then fails."""
    return device_type != "meta" and torch.is_autocast_enabled(device_type)


def autocast_off(device_type: str) -> contextlib.AbstractContextManager[object]:
    """A context with autocast off for ``device_type`` where it is on (else one that does
    nothing: entering torch.autocast costs a call its microseconds)."""
    if autocast_on(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


#: Whether a tensor is batched by torch's older vmap (``torch.autograd.grad``'s
#: ``is_grads_batched`` runs the backward under it, with no transform active).
_legacy_batched: Callable[[torch.Tensor], bool] = getattr(
    torch._C._functorch, "is_legacy_batchedtensor", lambda t: False
)


def refuse_batched_backward(*grads: torch.Tensor | None) -> None:
    """Raise where a cell call's backward runs under vmap (``grads``: its incoming ones):
    ``torch.autograd.grad(..., is_grads_batched=True)`` and
    ``torch.autograd.functional.jacobian``/``hessian(..., vectorize=True)`` batch it so, and
    torch's error from inside it (an in-place copy that vmap cannot batch) names nothing of
    rnncc's."""
    if torch.compiler.is_compiling():
        return
    if functorch_active() or any(g is not None and _legacy_batched(g) for g in grads):
        raise NotImplementedError(
            "rnncc: the backward of a cell call does not run batched (vmap): not under "
            "torch.autograd.grad(..., is_grads_batched=True) nor "
            "torch.autograd.functional.jacobian/hessian(..., vectorize=True); compute the "
            "rows one at a time (is_grads_batched=False, vectorize=False)"
        )


DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


class Sizes(NamedTuple):
    B: int
    T: int
    NH: int
    D: int


def _shape(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def _given(t: object) -> str:
    return f"a tensor of shape {_shape(t)}" if isinstance(t, torch.Tensor) else type(t).__name__


def _fits(t: object, shape: tuple[int, ...], like: torch.Tensor) -> bool:
    """Whether ``t`` is a tensor of ``shape`` with the dtype and device of ``like``: the check
    of every call, so no message is built here (``_reject`` builds it)."""
    return (
        isinstance(t, torch.Tensor)
        and t.shape == shape
        and t.dtype == like.dtype
        and t.device == like.device
    )


def _reject(
    name: str, t: object, shape: tuple[int, ...], legend: str, like: torch.Tensor
) -> NoReturn:
    """Raise the error of the first check of ``_fits`` that ``t`` fails."""
    want = "[" + ", ".join(str(s) for s in shape) + "]"
    if not isinstance(t, torch.Tensor):
        raise ValueError(
            f"{name} must be a torch.Tensor of shape {want} ({legend}), got {type(t).__name__}"
        )
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} has shape {_shape(t)}, expected {want} ({legend})")
    if t.dtype != like.dtype:
        raise ValueError(f"{name} has dtype {t.dtype}, expected {like.dtype} like Wx")
    if t.device != like.device:
        raise ValueError(f"{name} is on {t.device}, expected {like.device} like Wx")
    raise AssertionError(f"{name} was rejected but fits")  # _fits and _reject disagree


def validate(
    cell: Cell,
    Wx: torch.Tensor,
    R: torch.Tensor | None,
    b: torch.Tensor | None,
    states: torch.Tensor | None,
    params: torch.Tensor | None,
) -> Sizes:
    """Check every input against the cell; see the module docstring."""
    gx, gr, gb = len(cell.gx_names), len(cell.gr_names), len(cell.gb_names)
    ns, npar = len(cell.states), len(cell.params)
    if not isinstance(Wx, torch.Tensor):
        raise ValueError(
            f"Wx must be a torch.Tensor of shape [B, T, Gx={gx}, NH, D], got {type(Wx).__name__}"
        )
    if Wx.dim() != 5 or Wx.shape[2] != gx:
        raise ValueError(
            f"Wx has shape {_shape(Wx)}, expected [B, T, Gx={gx}, NH, D] "
            f"(the W x gates of cell '{cell.name}': {', '.join(cell.gx_names) or 'none'})"
        )
    if Wx.dtype not in DTYPES:
        raise ValueError(f"Wx has dtype {Wx.dtype}; supported: float32, float16, bfloat16, float64")
    B, T, _, NH, D = Wx.shape
    if gr:
        if R is None:
            raise ValueError(
                f"cell '{cell.name}' has R terms (gates {', '.join(cell.gr_names)}): "
                f"R of shape [Gr={gr}, NH={NH}, D={D}, D={D}] is required"
            )
        if not _fits(R, (gr, NH, D, D), Wx):
            _reject("R", R, (gr, NH, D, D), f"Gr={gr}, NH, D out, D in", Wx)
    elif R is not None:
        raise ValueError(f"cell '{cell.name}' has no 'R h' term: pass R=None, not {_given(R)}")
    if gb:
        if b is None:
            raise ValueError(
                f"cell '{cell.name}' has bias terms (gates {', '.join(cell.gb_names)}): "
                f"b of shape [Gb={gb}, NH={NH}, D={D}] is required"
            )
        if not _fits(b, (gb, NH, D), Wx):
            _reject("b", b, (gb, NH, D), f"Gb={gb}, NH, D", Wx)
    elif b is not None:
        raise ValueError(f"cell '{cell.name}' has no 'b' term: pass b=None, not {_given(b)}")
    if states is not None and not _fits(states, (ns, B, NH, D), Wx):
        _reject(
            "states",
            states,
            (ns, B, NH, D),
            f"S={ns} states {', '.join(cell.state_names)}, B, NH, D",
            Wx,
        )
    if params is not None:
        if not npar:
            raise ValueError(
                f"cell '{cell.name}' has no params: pass params=None, not {_given(params)}"
            )
        if not _fits(params, (npar, NH, D), Wx):
            _reject(
                "params",
                params,
                (npar, NH, D),
                f"P={npar} params {', '.join(cell.param_names)}, NH, D",
                Wx,
            )
    return Sizes(B, T, NH, D)


def validate_reverse(reverse: object, NH: int) -> int:
    """The first head that ``reverse`` runs in the reverse direction (``NH``: none): ``reverse``
    is a bool (every head), or a sequence of ``NH`` bools, one per head, where the reversed
    heads are the last ones (``[False] * k + [True] * (NH - k)``: a bidirectional layer's two
    directions as the two halves of its heads)."""
    if isinstance(reverse, bool):
        return 0 if reverse else NH
    if not isinstance(reverse, list | tuple) or not all(isinstance(r, bool) for r in reverse):
        raise ValueError(f"reverse must be True, False or one bool per head; got {reverse!r}")
    if len(reverse) != NH:
        raise ValueError(f"reverse has {len(reverse)} bools, expected one per head (NH={NH})")
    first = reverse.index(True) if True in reverse else NH
    if not all(reverse[first:]):
        raise ValueError(
            f"reverse={list(reverse)} reverses heads that are not the last ones: the kernels "
            "reverse heads k.. for one k ([False] * k + [True] * (NH - k))"
        )
    return first


class CheckedLengths(NamedTuple):
    """Per-row lengths that rnncc derived itself (``rnncc.RNN`` from a ``PackedSequence``'s
    batch sizes), in ``1 .. T`` by construction and already on the call's device:
    ``validate_lengths`` checks their shape but does not read them, since reading lengths on a
    GPU waits for the device."""

    tensor: torch.Tensor


def validate_lengths(
    lengths: object, B: int, T: int, device: torch.device, dtype: torch.dtype = torch.int64
) -> torch.Tensor:
    """``lengths`` as ``dtype`` on ``device``: a tensor ``[B]`` of integers in ``1 .. T``, on any
    device. They are checked where they are: on the CPU without waiting for the GPU, then
    copied to a CUDA ``device`` from pinned memory without a host synchronisation; on a GPU,
    reading them waits for it. ``CheckedLengths`` are only converted."""
    legend = f"[B={B}] integers in 1..T={T}"
    if isinstance(lengths, CheckedLengths):
        t = lengths.tensor
        assert tuple(t.shape) == (B,) and t.device == device, (tuple(t.shape), t.device, B, device)
        return t.to(dtype=dtype).contiguous()
    if not isinstance(lengths, torch.Tensor):
        raise ValueError(f"lengths must be a torch.Tensor {legend}, got {type(lengths).__name__}")
    where = f"(dtype {lengths.dtype}, on {lengths.device})"
    if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
        raise ValueError(f"lengths has dtype {lengths.dtype}, expected an integer dtype {legend}")
    if tuple(lengths.shape) != (B,):
        raise ValueError(f"lengths has shape {_shape(lengths)} {where}, expected {legend}")
    out = lengths.to(dtype=torch.int64)
    if B:
        lo, hi = out.aminmax()
        if lo < 1 or hi > T:
            bad = int(torch.nonzero((out < 1) | (out > T))[0, 0])
            raise ValueError(
                f"lengths[{bad}] = {int(out[bad])} {where} is outside 1..T={T}: every row "
                f"runs at least one and at most T steps"
            )
    return moved(out.to(dtype=dtype).contiguous(), device)


def moved(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device``; from the CPU to a CUDA device through pinned memory, a copy that
    does not wait for the GPU."""
    if t.device == device:
        return t
    if t.device.type == "cpu" and device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)
