"""The stepwise CUDA backend as a PyTorch custom op with autograd.

Input: a checked cell and its backward cell. Output: a ``StepwiseOps`` whose ``__call__`` runs
``(y, last)`` on CUDA tensors. Two libraries are involved:

- the host loop (``templates/stepwise_host.cpp``), generic over cells, built once per
  torch/CUDA/arch and loaded into torch as the ``rnncc_host`` op namespace;
- the cell's kernels (``rnncc.codegen.stepwise``), a torch-free library whose ``extern "C"``
  launchers the host loop calls through function pointers (``templates/rnncc_abi.h``).

Per cell, ``torch.library`` registers ``rnncc::<cell>_<key>_forward`` and ``..._backward``
with fake (meta) implementations and an autograd formula, so a model using
the cell works under ``torch.compile(fullgraph=True)`` and inside CUDA graphs. The forward
saves the per-step states and ``R h`` products (float32) only when a gradient is needed.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict, cast

import torch
from torch import Tensor

from rnncc.codegen.fused import (
    FUSED_DTYPES,
    exchange_words,
    fused_support,
    fused_tier,
    generate_fused,
)
from rnncc.codegen.stepwise import HEADERS, generate_stepwise
from rnncc.config import get_config
from rnncc.dump import dump
from rnncc.errors import BuildError, TilingError
from rnncc.ir.cell import BackwardCell, Cell
from rnncc.resources import templates_dir
from rnncc.runtime.build import build_library, device_arch

ABI_VERSION = 7
STORAGE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_lock = threading.Lock()

_ForwardOut = tuple[Tensor, Tensor, Tensor, Tensor]  # y, last, hist, rh
_BackwardOut = tuple[Tensor, Tensor, Tensor, Tensor, Tensor]  # dWx, dR, db, dstates, dparams


class _Factory(TypedDict):
    """Keyword arguments of a tensor factory (``new_empty``)."""

    dtype: torch.dtype
    device: torch.device


def _header_paths() -> list[Path]:
    return [templates_dir() / h for h in HEADERS]


@functools.cache
def host_library(arch: str) -> Path:
    """Build (or find) and load the generic host loop for ``arch``; checks its ABI."""
    source = (templates_dir() / "stepwise_host.cpp").read_text()
    path = build_library(
        "rnncc_stepwise_host",
        {"stepwise_host.cpp": source},
        arch=arch,
        headers=_header_paths(),
        description=f"stepwise host loop ({arch})",
    )
    torch.ops.load_library(str(path))
    version = torch.ops.rnncc_host.abi_version()
    if version != ABI_VERSION:
        raise BuildError(f"host library {path} has ABI {version}, expected {ABI_VERSION}")
    return path


def build_cell_library(cell: Cell, bwd: BackwardCell, arch: str) -> Path:
    """Build (or find in the cache) the cell's kernel library for ``arch``."""
    src = generate_stepwise(cell, bwd)
    dump(cell.name, "stepwise.cu", src.text)
    return build_library(
        f"rnncc_{cell.name}_stepwise",
        {src.filename: src.text},
        arch=arch,
        headers=_header_paths(),
        description=f"{cell.name} stepwise kernels ({arch})",
    )


class _CellOps:
    """A cell's registered forward op, called like the cell (inputs validated already)."""

    forward_op: Callable[..., tuple[Tensor, ...]]
    poison: bool

    def __call__(
        self,
        Wx: Tensor,
        R: Tensor | None,
        b: Tensor | None,
        states: Tensor,
        params: Tensor | None,
    ) -> tuple[Tensor, Tensor]:
        inputs = [t for t in (Wx, R, b, states, params) if t is not None]
        save = torch.is_grad_enabled() and any(t.requires_grad for t in inputs)
        y, last, _, _ = self.forward_op(Wx, R, b, states, params, save, self.poison)
        return y, last


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


def _dims(cell: Cell, exchange: int = 0) -> list[int]:
    """The cell's sizes as the host loop takes them: [S, O, Gx, Gr, Gb, P, recurrent index,
    the grid tier's exchange words per (head, batch row) or 0]."""
    rec = cell.state_names.index(cell.recurrent) if cell.recurrent else 0
    return [
        len(cell.states),
        len(cell.outputs),
        len(cell.gx_names),
        len(cell.gr_names),
        len(cell.gb_names),
        len(cell.params),
        rec,
        exchange,
    ]


def _key(path: Path) -> str:
    """The cache key part of a built library's folder name, to name its ops uniquely."""
    return path.parent.name.rsplit("-", 1)[-1]


class StepwiseOps(_CellOps):
    """The stepwise backend of one cell on one arch; see the module docstring."""

    def __init__(self, cell: Cell, bwd: BackwardCell, arch: str):
        self.poison = get_config().poison  # read once: the call path must stay compile-friendly
        with _lock:  # the host library is built and loaded once per process
            host_library(arch)
        path = build_cell_library(cell, bwd, arch)  # cell builds may run in parallel threads
        self._lib, (fwd, bwd_fn) = _launchers(path, "rnncc_forward_step", "rnncc_backward_step")
        with _lock:  # op registration mutates one shared torch.library.Library
            self.forward_op = _define_ops(f"{cell.name}_{_key(path)}", fwd, bwd_fn, _dims(cell))


class FusedOps(_CellOps):
    """The fused persistent forward and backward (block or grid tier) of one cell for one head dim:
    one launch each for the whole sequence; built when some storage dtype has a kernel at
    that head dim (the caller checks ``fused_support`` for the dtype it launches)."""

    def __init__(self, cell: Cell, bwd: BackwardCell, arch: str, D: int):
        reasons = [fused_support(cell, D, dtype) for dtype in FUSED_DTYPES]
        if all(reasons):
            why = "; ".join(r for r in reasons if r)
            raise TilingError(f"cell '{cell.name}': no fused kernel for head dim {D}: {why}")
        self.poison = get_config().poison
        with _lock:
            host_library(arch)
        src = generate_fused(cell, bwd, D)
        dump(cell.name, f"fused_d{D}.cu", src.text)
        path = build_library(
            f"rnncc_{cell.name}_fused_d{D}",
            {src.filename: src.text},
            arch=arch,
            headers=_header_paths(),
            description=f"{cell.name} fused kernels (head dim {D}, {arch})",
        )
        self._lib, (fwd, bwd_fn) = _launchers(path, "rnncc_fused_forward", "rnncc_fused_backward")
        name = f"{cell.name}_fused_{_key(path)}"
        grid = any(fused_tier(cell, D, dtype) == "grid" for dtype in FUSED_DTYPES)
        dims = _dims(cell, exchange_words(cell, D) if grid else 0)
        with _lock:
            self.forward_op = _define_ops(name, fwd, bwd_fn, dims, "fused")


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


_defined: dict[str, Callable[..., tuple[Tensor, ...]]] = {}
_library: torch.library.Library | None = None

_FORWARD_SCHEMA = (
    "{name}_forward(Tensor Wx, Tensor? R, Tensor? b, Tensor states, Tensor? params, bool save, "
    "bool poison) -> (Tensor, Tensor, Tensor, Tensor)"
)
_BACKWARD_SCHEMA = (
    "{name}_backward(Tensor dy, Tensor dlast, Tensor Wx, Tensor? R, Tensor? b, Tensor? params, "
    "Tensor hist, Tensor rh, bool poison) -> (Tensor, Tensor, Tensor, Tensor, Tensor)"
)


def _define_ops(
    name: str, fwd_ptr: int, bwd_ptr: int, dims: list[int], host: str = "stepwise"
) -> Callable[..., tuple[Tensor, ...]]:
    """Register (once per process) the ops of one cell library: schema, CUDA kernel, fake
    implementation, autograd. ``host`` picks the host library's entry points
    (``stepwise_forward``/``_backward`` or ``fused_forward``/``_backward``: same tensors).
    Registered through ``torch.library.Library`` rather than ``custom_op``, whose first call
    imports torch._dynamo (seconds) even in eager mode."""
    global _library
    if name in _defined:
        return _defined[name]
    if _library is None:
        _library = torch.library.Library("rnncc", "FRAGMENT")
    lib = _library
    S, O, _, Gr, _, _, _, _ = dims
    lib.define(_FORWARD_SCHEMA.format(name=name))
    lib.define(_BACKWARD_SCHEMA.format(name=name))

    def forward(
        Wx: Tensor,
        R: Tensor | None,
        b: Tensor | None,
        states: Tensor,
        params: Tensor | None,
        save: bool,
        poison: bool,
    ) -> _ForwardOut:
        out = getattr(torch.ops.rnncc_host, f"{host}_forward")(
            Wx, R, b, states, params, fwd_ptr, dims, save, poison
        )
        return cast(_ForwardOut, out)

    def forward_fake(
        Wx: Tensor,
        R: Tensor | None,
        b: Tensor | None,
        states: Tensor,
        params: Tensor | None,
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
        hist: Tensor,
        rh: Tensor,
        poison: bool,
    ) -> _BackwardOut:
        out = getattr(torch.ops.rnncc_host, f"{host}_backward")(
            dy, dlast, Wx, R, b, params, hist, rh, bwd_ptr, dims, poison
        )
        return cast(_BackwardOut, out)

    def backward_fake(
        dy: Tensor,
        dlast: Tensor,
        Wx: Tensor,
        R: Tensor | None,
        b: Tensor | None,
        params: Tensor | None,
        hist: Tensor,
        rh: Tensor,
        poison: bool,
    ) -> _BackwardOut:
        return (
            Wx.new_empty(Wx.shape),
            Wx.new_empty((0,)) if R is None else R.new_empty(R.shape),
            Wx.new_empty((0,)) if b is None else b.new_empty(b.shape),
            dlast.new_empty(dlast.shape),
            Wx.new_empty((0,)) if params is None else params.new_empty(params.shape),
        )

    lib.impl(f"{name}_forward", forward, "CUDA")
    lib.impl(f"{name}_backward", backward, "CUDA")
    torch.library.register_fake(f"rnncc::{name}_forward", forward_fake, lib=lib)
    torch.library.register_fake(f"rnncc::{name}_backward", backward_fake, lib=lib)
    backward_op = getattr(torch.ops.rnncc, f"{name}_backward")

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: _ForwardOut) -> None:
        Wx, R, b, states, params, save, poison = inputs
        _, _, hist, rh = output
        # states only to tell a second differentiation apart (see _first_order_only).
        ctx.save_for_backward(Wx, R, b, states, params, hist, rh)
        ctx.has = (R is not None, b is not None, params is not None)
        ctx.poison = poison
        ctx.states_shape = states.shape
        ctx.states_dtype = states.dtype
        ctx.save = save
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
        if not ctx.save:
            raise RuntimeError(
                "rnncc: this forward ran without saving for backward (no input required grad)"
            )
        Wx, R, b, states, params, hist, rh = ctx.saved_tensors
        B, T, _, NH, D = Wx.shape
        if dy is None:
            dy = Wx.new_zeros((O, B, T, NH, D))
        if dlast is None:
            dlast = Wx.new_zeros(ctx.states_shape)
        dWx, dR, db, dstates, dparams = backward_op(
            dy, dlast.to(Wx.dtype), Wx, R, b, params, hist, rh, ctx.poison
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
        return (*grads, None, None)

    torch.library.register_autograd(
        f"rnncc::{name}_forward", grad, setup_context=setup_context, lib=lib
    )
    op: Callable[..., tuple[Tensor, ...]] = getattr(torch.ops.rnncc, f"{name}_forward")
    _defined[name] = op
    return op


@functools.cache
def arch_of(device_index: int) -> str:
    """The build arch of a CUDA device (cached: a device's capability does not change)."""
    return device_arch(device_index)
