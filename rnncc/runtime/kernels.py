"""A kernel variant's library for one cell, as PyTorch custom ops with autograd.

Input: a checked cell, its backward cell and a plan's ``build`` record. Output: ``KernelOps``,
called like the cell with the plan's ``Launch``. Two libraries are involved:

- the host loop (``templates/stepwise_host.cpp``), generic over cells, built once per
  torch/CUDA/arch and loaded into torch as the ``rnncc_host`` op namespace;
- the variant's kernels for the cell (rendered by the variant), a torch-free library whose
  ``extern "C"`` launchers the host loop calls through function pointers
  (``templates/rnncc_abi.h``). The build record is hashed into the library's cache key and
  kept in its manifest, beside it.

Per library, ``torch.library`` registers ``rnncc::<cell>_<variant>_<key>_forward`` and
``..._backward`` with fake (meta) implementations and an autograd formula, so a model using
the cell works under ``torch.compile(fullgraph=True)`` and inside CUDA graphs. The launch
(which kernel, block, grid, exchange buffer) is an argument of the ops: it depends on the
batch, the library does not. The forward saves the per-step states and ``R h`` products
(float32) only when a gradient is needed.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple, TypedDict, cast

import torch
from torch import Tensor

from rnncc.config import get_config
from rnncc.dump import dump
from rnncc.errors import BuildError
from rnncc.ir.cell import BackwardCell, Cell
from rnncc.resources import templates_dir
from rnncc.runtime.build import build_library, device_arch
from rnncc.runtime.validate import refuse_batched_backward
from rnncc.variants import BY_NAME, Launch

ABI_VERSION = 12
#: The headers the host loop includes (a kernel library's are its GeneratedSource's).
HOST_HEADERS = ("rnncc_abi.h",)
_lock = threading.Lock()

_ForwardOut = tuple[Tensor, Tensor, Tensor, Tensor]  # y, last, hist, rh
_BackwardOut = tuple[Tensor, Tensor, Tensor, Tensor, Tensor]  # dWx, dR, db, dstates, dparams


class _Factory(TypedDict):
    """Keyword arguments of a tensor factory (``new_empty``)."""

    dtype: torch.dtype
    device: torch.device


def _header_paths(names: tuple[str, ...]) -> list[Path]:
    return [templates_dir() / h for h in names]


@functools.cache
def host_library(arch: str) -> Path:
    """Build (or find) and load the generic host loop for ``arch``; checks its ABI."""
    source = (templates_dir() / "stepwise_host.cpp").read_text()
    path = build_library(
        "rnncc_stepwise_host",
        {"stepwise_host.cpp": source},
        arch=arch,
        headers=_header_paths(HOST_HEADERS),
        description=f"stepwise host loop ({arch})",
    )
    torch.ops.load_library(str(path))
    version = torch.ops.rnncc_host.abi_version()
    if version != ABI_VERSION:
        raise BuildError(f"host library {path} has ABI {version}, expected {ABI_VERSION}")
    return path


def build_kernels(cell: Cell, bwd: BackwardCell, build: Mapping[str, Any], arch: str) -> Path:
    """Build (or find in the cache) the library of the variant and compile-time constants in
    ``build`` for ``cell`` on ``arch``; the record goes into the cache key and manifest."""
    variant = BY_NAME[build["variant"]]
    src = variant.render(cell, bwd, build)
    dump(cell.name, src.filename.removeprefix(f"{cell.name}_"), src.text)
    size = f"head dim {build['D']}, " if "D" in build else ""
    return build_library(
        variant.library_name(cell.name, build),
        {src.filename: src.text},
        arch=arch,
        headers=_header_paths(src.headers),
        description=f"{cell.name} {variant.name} kernels ({size}{arch})",
        plan=dict(build),
    )


def _launchers(path: Path, *symbols: str) -> tuple[ctypes.CDLL, list[int]]:
    """Load a kernel library, check its ABI, and return it (keep it alive) with the addresses
    of its ``extern "C"`` launchers."""
    lib = ctypes.CDLL(str(path))
    if lib.rnncc_abi_version() != ABI_VERSION:
        raise BuildError(
            f"library {path} has ABI {lib.rnncc_abi_version()}, expected {ABI_VERSION}"
        )
    # ctypes resolves each symbol or raises AttributeError, so no address is NULL.
    return lib, [
        int(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or 0) for name in symbols
    ]


def _dims(cell: Cell) -> list[int]:
    """The cell's sizes as the host loop takes them: [S, O, Gx, Gr, Gb, P, recurrent index]."""
    rec = cell.state_names.index(cell.recurrent) if cell.recurrent else 0
    return [
        len(cell.states),
        len(cell.outputs),
        len(cell.gx_names),
        len(cell.gr_names),
        len(cell.gb_names),
        len(cell.params),
        rec,
    ]


def _key(path: Path) -> str:
    """The cache key part of a built library's folder name, to name its ops uniquely."""
    return path.parent.name.rsplit("-", 1)[-1]


_ENTRY_POINTS = {
    "stepwise": ("rnncc_forward_step", "rnncc_backward_step", "rnncc_decode"),
    "fused": ("rnncc_fused_forward", "rnncc_fused_backward"),
}


class KernelOps:
    """One variant's library for one cell on one arch, its ops registered; called like the
    cell (inputs validated already) with a plan's launch."""

    def __init__(self, cell: Cell, bwd: BackwardCell, build: Mapping[str, Any], arch: str):
        self.build = dict(build)
        self.poison = get_config().poison  # read once: the call path must stay compile-friendly
        with _lock:  # the host library is built and loaded once per process
            host_library(arch)
        path = build_kernels(cell, bwd, build, arch)  # builds may run in parallel threads
        host = BY_NAME[build["variant"]].host
        self._lib, (fwd, bwd_fn, *decode) = _launchers(path, *_ENTRY_POINTS[host])
        self._dims = _dims(cell)
        #: The library's decoding step (the stepwise library's), or None.
        self._decode_fn = decode[0] if decode else None
        name = f"{cell.name}_{build['variant']}_{_key(path)}"
        with _lock:  # op registration mutates one shared torch.library.Library
            self._run = _define_ops(name, fwd, bwd_fn, self._dims, host)

    def __call__(
        self,
        Wx: Tensor,
        R: Tensor | None,
        b: Tensor | None,
        states: Tensor,
        params: Tensor | None,
        launch: Launch,
        lengths: Tensor | None = None,
        reverse_from: int | None = None,
    ) -> tuple[Tensor, Tensor]:
        """``lengths``: int32 ``[B]`` on the device of ``Wx``, or None (every row runs ``T``
        steps); heads ``reverse_from ..`` run reversed (None: none). A library whose kernels
        were built without them (``Variant.runs_timeline``) takes neither."""
        NH = Wx.shape[3]
        reverse_from = NH if reverse_from is None else reverse_from
        if (lengths is not None or reverse_from < NH) and not BY_NAME[
            self.build["variant"]
        ].runs_timeline(self.build):
            raise RuntimeError(
                f"rnncc: the {self.build['variant']} kernels were built without per-row lengths "
                "and the reverse direction: their plan needs timeline=True"
            )
        save = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (Wx, R, b, states, params)
        )
        # An eager call on plain tensors skips the registered op's trip through the dispatcher
        # and torch.library's autograd wrapper: host time that a call with a short kernel
        # waits for. torch.compile, export and fake tensors take the op.
        if not _eager(Wx):
            run = self._run.op
        else:
            run = self._run.recorded if save else self._run.impl
        y, last, _, _ = run(
            Wx, R, b, states, params, lengths, reverse_from, launch.as_list(), save, self.poison
        )
        return y, last

    def decode(
        self,
        x: Tensor | None,
        W: Tensor | None,
        Wb: Tensor | None,
        Wx: Tensor | None,
        R: Tensor | None,
        b: Tensor | None,
        states: Tensor,
        params: Tensor | None,
        y: Tensor | None,
        new_states: Tensor,
    ) -> None:
        """One decoding step into ``y`` ``[O, B, NH, D]`` (or None) and ``new_states``
        (``[S, B, NH, D]`` views, the states possibly strided, as ``states``): from ``x``
        ``[B, I]`` with the input projection ``W`` ``[Gx·NH·D, I]`` and ``Wb``, or from ``Wx``
        ``[B, Gx, NH, D]``; inputs checked by the caller, no autograd (rnncc_abi.h:
        rnncc_decode)."""
        if self._decode_fn is None:
            raise RuntimeError(f"rnncc: the {self.build['variant']} library has no decoding step")
        _decode_op()(x, W, Wb, Wx, R, b, states, params, self._decode_fn, y, new_states)

    def decode_stack(
        self,
        x: Tensor | None,
        weights: list[Tensor],
        present: int,
        states: Tensor,
        heads: int,
        first: int,
        dropout: float,
        y: Tensor,
        new_states: Tensor,
    ) -> None:
        """One decoding step of a unidirectional stack, a launch per layer, in one call from
        Python: layer ``l`` reads ``states[:, l]`` and writes ``new_states[:, l]`` (``[S, L, B,
        H]``, each ``(B, H)`` slice contiguous; ``states`` may repeat one layer's, stride 0),
        from ``x`` ``[B, I]`` (the first layer) or the output of the layer below (its new state
        ``first`` for a one-output cell, else its outputs as ``[B, O·H]``), dropout ``dropout``
        between layers; the top layer's outputs into ``y`` ``[B, O·H]``. ``weights``: layer by
        layer, those of the layer's ``(W, Wb, R, b, params)`` (as ``decode`` takes each) that
        bit 0, 1, ... of ``present`` marks, the same for every layer. Inputs checked by the
        caller, no autograd (rnncc_abi.h: rnncc_decode)."""
        if self._decode_fn is None:
            raise RuntimeError(f"rnncc: the {self.build['variant']} library has no decoding step")
        _decode_stack_op()(
            x,
            weights,
            present,
            states,
            self._decode_fn,
            self._dims[1],
            heads,
            first,
            dropout,
            y,
            new_states,
        )


@functools.cache
def _decode_stack_op() -> Callable[..., None]:
    """The host library's decode_stack op, resolved once."""
    op: Callable[..., None] = torch.ops.rnncc_host.decode_stack.default
    return op


@functools.cache
def _decode_op() -> Callable[..., None]:
    """The host library's decode op, resolved once (its overload: no lookup per step)."""
    op: Callable[..., None] = torch.ops.rnncc_host.decode.default
    return op


class _SecondOrderError(torch.autograd.Function):
    """Passes gradients through unchanged; differentiating them raises. The kernels' backward
    is not itself differentiable, and without this a second differentiation would silently
    leave out every term through it."""

    @staticmethod
    def forward(ctx: Any, backend: str, anchor: Tensor, *grads: Tensor) -> tuple[Tensor, ...]:
        ctx.backend = backend
        return tuple(g.view_as(g) for g in grads)

    @staticmethod
    def backward(ctx: Any, *_: Tensor | None) -> tuple[None, ...]:
        raise RuntimeError(
            f"rnncc: the {ctx.backend} backend's backward is not differentiable: second-order "
            "gradients (double backward, gradient penalties) need backend='reference'"
        )


def _first_order_only(
    backend: str, inputs: tuple[Tensor | None, ...], grads: tuple[Tensor | None, ...]
) -> tuple[Tensor | None, ...]:
    """``grads`` made to raise when differentiated, if a second differentiation could reach
    them (some input of the backward requires grad); else ``grads`` as they are."""
    anchor = next((t for t in inputs if t is not None and t.requires_grad), None)
    present = [g for g in grads if g is not None]
    if anchor is None or not present:
        return grads
    wrapped = iter(_SecondOrderError.apply(backend, anchor, *present))
    return tuple(None if g is None else next(wrapped) for g in grads)


def _eager(t: Tensor) -> bool:
    """Whether a call on ``t`` may skip a registered op's dispatch and run its CUDA
    implementation: ``t`` is a plain tensor (not a fake, functional or other subclass that
    torch.compile, export or a dispatch mode traces with) and nothing is being compiled."""
    return type(t) is Tensor and not torch.compiler.is_compiling()


class _Ops(NamedTuple):
    """One library's forward, three ways to run it (the same arguments, the same outputs)."""

    op: Callable[..., tuple[Tensor, ...]]  # the registered op, with its autograd
    impl: Callable[..., tuple[Tensor, ...]]  # its CUDA implementation: nothing to differentiate
    recorded: Callable[..., tuple[Tensor, ...]]  # the op's autograd as a torch.autograd.Function


_defined: dict[str, _Ops] = {}
_library: torch.library.Library | None = None

_FORWARD_SCHEMA = (
    "{name}_forward(Tensor Wx, Tensor? R, Tensor? b, Tensor states, Tensor? params, "
    "Tensor? lengths, int reverse_from, int[] launch, bool save, bool poison) -> (Tensor, Tensor, Tensor, Tensor)"
)
_BACKWARD_SCHEMA = (
    "{name}_backward(Tensor dy, Tensor dlast, Tensor Wx, Tensor? R, Tensor? b, Tensor? params, "
    "Tensor? lengths, int reverse_from, Tensor hist, Tensor rh, int[] launch, bool poison, bool defer_dR) "
    "-> (Tensor, Tensor, Tensor, Tensor, Tensor)"
)


def _define_ops(
    name: str, fwd_ptr: int, bwd_ptr: int, dims: list[int], host: str = "stepwise"
) -> _Ops:
    """Register (once per process) the ops of one cell library: schema, CUDA kernel, fake
    implementation, autograd; returns the forward op, its CUDA implementation and its
    autograd as a ``torch.autograd.Function`` (``_Ops``). ``host`` picks the host library's
    entry points (``stepwise_forward``/``_backward`` or ``fused_forward``/``_backward``).
    Registered through ``torch.library.Library`` rather than ``custom_op``, whose first call
    imports torch._dynamo (seconds) even in eager mode."""
    global _library
    if name in _defined:
        return _defined[name]
    if _library is None:
        _library = torch.library.Library("rnncc", "FRAGMENT")
    lib = _library
    S, O, _, Gr, _, _, _ = dims

    def _launch_arg(launch: list[int]) -> tuple[list[int], ...]:
        # The stepwise host loop takes no launch: it launches its kernels per step.
        return (launch,) if host == "fused" else ()

    lib.define(_FORWARD_SCHEMA.format(name=name))
    lib.define(_BACKWARD_SCHEMA.format(name=name))

    def forward(
        Wx: Tensor,
        R: Tensor | None,
        b: Tensor | None,
        states: Tensor,
        params: Tensor | None,
        lengths: Tensor | None,
        reverse_from: int,
        launch: list[int],
        save: bool,
        poison: bool,
    ) -> _ForwardOut:
        run = getattr(torch.ops.rnncc_host, f"{host}_forward")
        out = run(
            Wx,
            R,
            b,
            states,
            params,
            lengths,
            reverse_from,
            fwd_ptr,
            dims,
            *_launch_arg(launch),
            save,
            poison,
        )
        return cast(_ForwardOut, out)

    def forward_fake(
        Wx: Tensor,
        R: Tensor | None,
        b: Tensor | None,
        states: Tensor,
        params: Tensor | None,
        lengths: Tensor | None,
        reverse_from: int,
        launch: list[int],
        save: bool,
        poison: bool,
    ) -> _ForwardOut:
        B, T, _, NH, D = Wx.shape
        f32 = _Factory(dtype=torch.float32, device=Wx.device)
        hist = Wx.new_empty((T + 1, S, NH, B, D), **f32) if save else Wx.new_empty((0,), **f32)
        rh = Wx.new_empty((T, NH, B, Gr * D), **f32) if save and Gr else Wx.new_empty((0,), **f32)
        return Wx.new_empty((O, B, T, NH, D)), Wx.new_empty((S, B, NH, D)), hist, rh

    def backward(
        dy: Tensor,
        dlast: Tensor,
        Wx: Tensor,
        R: Tensor | None,
        b: Tensor | None,
        params: Tensor | None,
        lengths: Tensor | None,
        reverse_from: int,
        hist: Tensor,
        rh: Tensor,
        launch: list[int],
        poison: bool,
        defer_dR: bool,
    ) -> _BackwardOut:
        run = getattr(torch.ops.rnncc_host, f"{host}_backward")
        out = run(
            dy,
            dlast,
            Wx,
            R,
            b,
            params,
            lengths,
            reverse_from,
            hist,
            rh,
            bwd_ptr,
            dims,
            *_launch_arg(launch),
            poison,
            defer_dR,
        )
        return cast(_BackwardOut, out)

    def backward_fake(
        dy: Tensor,
        dlast: Tensor,
        Wx: Tensor,
        R: Tensor | None,
        b: Tensor | None,
        params: Tensor | None,
        lengths: Tensor | None,
        reverse_from: int,
        hist: Tensor,
        rh: Tensor,
        launch: list[int],
        poison: bool,
        defer_dR: bool,
    ) -> _BackwardOut:
        B, T, _, NH, D = Wx.shape
        return (
            Wx.new_empty(Wx.shape),
            Wx.new_empty((0,))
            if R is None
            else Wx.new_empty((NH, T, B, Gr * D))
            if defer_dR
            else R.new_empty(R.shape),
            Wx.new_empty((0,)) if b is None else b.new_empty(b.shape),
            dlast.new_empty(dlast.shape),
            Wx.new_empty((0,)) if params is None else params.new_empty(params.shape),
        )

    lib.impl(f"{name}_forward", forward, "CUDA")
    lib.impl(f"{name}_backward", backward, "CUDA")
    torch.library.register_fake(f"rnncc::{name}_forward", forward_fake, lib=lib)
    torch.library.register_fake(f"rnncc::{name}_backward", backward_fake, lib=lib)
    backward_op = getattr(torch.ops.rnncc, f"{name}_backward")

    def save_context(ctx: Any, inputs: tuple[Any, ...], output: _ForwardOut) -> None:
        Wx, R, b, states, params, lengths, reverse_from, launch, save, poison = inputs
        _, _, hist, rh = output
        # states only to tell a second differentiation apart (see _first_order_only).
        ctx.save_for_backward(Wx, R, b, states, params, lengths, hist, rh)
        ctx.reverse_from = reverse_from
        ctx.has = (R is not None, b is not None, params is not None)
        ctx.poison = poison
        ctx.launch = launch
        ctx.states_shape = states.shape
        ctx.states_dtype = states.dtype
        ctx.save = save
        # where to leave R's gradient, rather than return it (rnncc/runtime/overlap.py:
        # defer_r_gradient): R's gate cotangents, for dR to be made on another stream
        ctx.r_gradient_later = None
        # hist and rh are outputs only to be saved: without this, autograd would fill a zero
        # gradient of each (hundreds of MB at T = 1024) before every backward.
        ctx.set_materialize_grads(False)

    def grad(
        ctx: Any,
        dy: Tensor | None,
        dlast: Tensor | None,
        _dhist: Tensor | None,
        _drh: Tensor | None,
    ) -> tuple[Tensor | None, ...]:
        refuse_batched_backward(dy, dlast)
        if not ctx.save:
            raise RuntimeError(
                "rnncc: this forward ran without saving for backward (no input required grad)"
            )
        Wx, R, b, states, params, lengths, hist, rh = ctx.saved_tensors
        B, T, _, NH, D = Wx.shape
        if dy is None:
            dy = Wx.new_zeros((O, B, T, NH, D))
        if dlast is None:
            dlast = Wx.new_zeros(ctx.states_shape)
        # The backward's CUDA implementation itself where nothing records its graph (as
        # KernelOps.__call__ does for the forward).
        direct = not torch.is_grad_enabled() and _eager(Wx)
        later = ctx.r_gradient_later if R is not None else None
        defer = later is not None and direct
        dWx, dR, db, dstates, dparams = (backward if direct else backward_op)(
            dy,
            dlast.to(Wx.dtype),
            Wx,
            R,
            b,
            params,
            lengths,
            ctx.reverse_from,
            hist,
            rh,
            ctx.launch,
            ctx.poison,
            defer,
        )
        has_r, has_b, has_p = ctx.has
        grads: tuple[Tensor | None, ...] = (
            dWx,
            dR if has_r else None,
            db if has_b else None,
            dstates.to(ctx.states_dtype),
            dparams if has_p else None,
        )
        if torch.is_grad_enabled():  # create_graph=True
            grads = _first_order_only(host, (dy, dlast, Wx, R, b, states, params), grads)
        if later is not None:
            if defer:
                later["G"] = (dR, hist, dims)
            else:
                later["dR"] = grads[1]
            grads = (grads[0], None, *grads[2:])
        return (*grads, None, None, None, None, None)

    torch.library.register_autograd(
        f"rnncc::{name}_forward", grad, setup_context=save_context, lib=lib
    )

    class Recorded(torch.autograd.Function):
        """The registered op's autograd (the same forward, context and backward) without its
        wrapper, whose filling of default arguments walks the schema on every call. Its
        forward takes the context itself: given a separate ``setup_context``,
        ``Function.apply`` binds every call's arguments to ``forward``'s signature through
        ``inspect`` (about 25 µs of host time a call). Like the reference backend's Function,
        it does not run under torch.func transforms."""

        @staticmethod
        def forward(ctx: Any, *args: Any) -> _ForwardOut:
            out = forward(*args)
            save_context(ctx, args, out)
            return out

        @staticmethod
        def backward(ctx: Any, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
            return grad(ctx, *grads)

    op: Callable[..., tuple[Tensor, ...]] = getattr(torch.ops.rnncc, f"{name}_forward")
    _defined[name] = _Ops(op, forward, Recorded.apply)
    return _defined[name]


@functools.cache
def arch_of(device_index: int) -> str:
    """The build arch of a CUDA device (cached: a device's capability does not change)."""
    return device_arch(device_index)
