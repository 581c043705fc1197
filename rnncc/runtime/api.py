"""The user-facing cell object: ``rnncc.load(path)`` / ``rnncc.loads(text)`` → ``CompiledCell``.

A ``CompiledCell`` holds the checked forward IR and its derived backward IR and is called
like a function of tensors (DESIGN.md §2)::

    y, last = cell(Wx, R, b, states=None, params=None, backend="auto")

It validates the inputs (``ValueError`` naming the tensor, the expected and the actual
shape, dtype or device), fills defaults (declared initial states and params), picks a
backend and records which one ran in ``last_backend``. Backends: ``"reference"`` (torch ops,
any device), ``"stepwise"`` (CUDA: one matrix product and one generated pointwise kernel
per step, built on first use), ``"fused"`` (the persistent forward and backward, one launch
each per sequence: the block tier for heads that fit one SM, the grid tier for bf16/fp16
heads of up to 1024 units; ``TilingError`` with the reason otherwise), ``"auto"`` (the
reference on CPU; on CUDA the fused kernel where one runs the size, else the stepwise
backend with a warning once per cell, so slowness is never silent).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rnncc.autodiff import derive_backward
from rnncc.dump import dump
from rnncc.errors import Diagnostic, TilingError
from rnncc.frontend import compile_source, select_cell
from rnncc.ir.cell import BackwardCell, Cell
from rnncc.ir.printer import print_backward, print_cell
from rnncc.runtime.reference import initial_params, initial_states, run_reference
from rnncc.runtime.validate import validate

if TYPE_CHECKING:  # the stepwise backend is imported on first use, in _stepwise_ops
    from rnncc.runtime.stepwise import FusedOps, StepwiseOps

BACKENDS = ("auto", "reference", "stepwise", "fused")
_CUDA_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class RnnccWarning(UserWarning):
    """Warnings of rnncc: unused declarations in a cell, slow fallbacks."""


class CompiledCell:
    """A checked cell and its backward, callable on tensors; see the module docstring."""

    def __init__(
        self,
        ir: Cell,
        warnings_: tuple[Diagnostic, ...] = (),
        *,
        backward_ir: BackwardCell | None = None,
    ):
        self.ir = ir
        self.backward_ir: BackwardCell = backward_ir or derive_backward(ir)
        dump(ir.name, "backward.rnn", print_backward(self.backward_ir))
        self.warnings = warnings_
        self.last_backend: str | None = None
        self._warned: set[str] = set()
        self._stepwise: dict[str, StepwiseOps] = {}
        self._fused: dict[tuple[str, int], FusedOps] = {}
        self._support: dict[tuple[int, torch.dtype], str | None] = {}  # fused_support's answers

    # ---- description ---------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.ir.name

    @property
    def state_names(self) -> tuple[str, ...]:
        return self.ir.state_names

    @property
    def param_names(self) -> tuple[str, ...]:
        return self.ir.param_names

    @property
    def outputs(self) -> tuple[str, ...]:
        return self.ir.outputs

    @property
    def gx_names(self) -> tuple[str, ...]:
        return self.ir.gx_names

    @property
    def gr_names(self) -> tuple[str, ...]:
        return self.ir.gr_names

    @property
    def gb_names(self) -> tuple[str, ...]:
        return self.ir.gb_names

    def shapes(self, B: int, T: int, NH: int, D: int) -> dict[str, tuple[int, ...] | None]:
        """The shape of every input and output at the given sizes (None: pass None)."""
        gx, gr, gb = len(self.gx_names), len(self.gr_names), len(self.gb_names)
        S, P, O = len(self.state_names), len(self.param_names), len(self.outputs)
        return {
            "Wx": (B, T, gx, NH, D),
            "R": (gr, NH, D, D) if gr else None,
            "b": (gb, NH, D) if gb else None,
            "states": (S, B, NH, D),
            "params": (P, NH, D) if P else None,
            "y": (O, B, T, NH, D),
            "last": (S, B, NH, D),
        }

    def source(self) -> str:
        """The forward cell printed in the surface syntax."""
        return print_cell(self.ir)

    def backward_source(self) -> str:
        """The derived backward cell, printed for reading."""
        return print_backward(self.backward_ir)

    def initial_states(
        self, B: int, NH: int, D: int, *, dtype: torch.dtype = torch.float32, device: Any = "cpu"
    ) -> torch.Tensor:
        return initial_states(self.ir, B, NH, D, dtype, device)

    def initial_params(
        self, NH: int, D: int, *, dtype: torch.dtype = torch.float32, device: Any = "cpu"
    ) -> torch.Tensor | None:
        return initial_params(self.ir, NH, D, dtype, device) if self.ir.params else None

    def __repr__(self) -> str:
        parts = [
            f"states={list(self.state_names)}",
            f"Wx gates={list(self.gx_names)}",
            f"R gates={list(self.gr_names)}",
            f"b gates={list(self.gb_names)}",
        ]
        if self.param_names:
            parts.append(f"params={list(self.param_names)}")
        parts.append(f"outputs={list(self.outputs)}")
        return f"CompiledCell({self.name}: {', '.join(parts)})"

    # ---- calling -------------------------------------------------------------------------
    def __call__(
        self,
        Wx: torch.Tensor,
        R: torch.Tensor | None = None,
        b: torch.Tensor | None = None,
        states: torch.Tensor | None = None,
        params: torch.Tensor | None = None,
        backend: str = "auto",
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
        sizes = validate(self.ir, Wx, R, b, states, params)
        if states is None:
            states = initial_states(self.ir, sizes.B, sizes.NH, sizes.D, Wx.dtype, Wx.device)
        if params is None and self.ir.params:
            params = initial_params(self.ir, sizes.NH, sizes.D, Wx.dtype, Wx.device)
        chosen = self._choose(backend, Wx, sizes.D)
        self.last_backend = chosen
        if chosen == "fused":
            return self._fused_ops(Wx.device, sizes.D)(Wx, R, b, states, params)
        if chosen == "stepwise":
            return self._stepwise_ops(Wx.device)(Wx, R, b, states, params)
        return run_reference(self.ir, self.backward_ir, Wx, R, b, states, params)

    def fused_support(self, head_dim: int, dtype: torch.dtype = torch.bfloat16) -> str | None:
        """None when the fused kernel runs this cell at ``head_dim`` with storage ``dtype``;
        else why it does not. float32 runs an FFMA product (fp32-accurate), float16 and
        bfloat16 the tensor cores; their size limits differ."""
        from rnncc.codegen.fused import fused_support

        if dtype not in _CUDA_DTYPES:
            return f"{dtype} is not a storage dtype of the CUDA backends"
        key = (head_dim, dtype)
        if key not in self._support:  # asked on every call: the answer is computed once
            self._support[key] = fused_support(self.ir, head_dim, str(dtype).removeprefix("torch."))
        return self._support[key]

    def prepare(self, device: torch.device | str = "cuda", head_dim: int | None = None) -> None:
        """Build (or load from the cache) the CUDA kernels for ``device`` now rather than at the
        first call — with ``head_dim``, also the fused kernel when it supports that size. Safe
        to call from several threads for different cells at once."""
        dev = torch.device(device)
        self._stepwise_ops(dev)
        if head_dim is not None and any(
            self.fused_support(head_dim, dtype) is None for dtype in _CUDA_DTYPES
        ):
            self._fused_ops(dev, head_dim)

    def _arch(self, device: torch.device) -> str:
        from rnncc.runtime.stepwise import arch_of

        return arch_of(device.index if device.index is not None else torch.cuda.current_device())

    def _stepwise_ops(self, device: torch.device) -> StepwiseOps:
        from rnncc.runtime.stepwise import StepwiseOps

        arch = self._arch(device)
        ops = self._stepwise.get(arch)
        if ops is None:
            ops = self._stepwise[arch] = StepwiseOps(self.ir, self.backward_ir, arch)
        return ops

    def _fused_ops(self, device: torch.device, head_dim: int) -> FusedOps:
        from rnncc.runtime.stepwise import FusedOps

        key = (self._arch(device), head_dim)
        ops = self._fused.get(key)
        if ops is None:
            ops = self._fused[key] = FusedOps(self.ir, self.backward_ir, key[0], head_dim)
        return ops

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned and not torch.compiler.is_compiling():
            self._warned.add(key)
            warnings.warn(f"rnncc: cell '{self.name}': {message}", RnnccWarning, stacklevel=4)

    def _choose(self, backend: str, Wx: torch.Tensor, head_dim: int) -> str:
        on_cuda = Wx.device.type == "cuda"
        if backend in ("stepwise", "fused"):
            if not on_cuda:
                raise ValueError(
                    f"backend='{backend}' runs on CUDA tensors; Wx is on {Wx.device} "
                    "(use backend='reference' on the CPU)"
                )
            if Wx.dtype not in _CUDA_DTYPES:
                raise ValueError(
                    f"backend='{backend}' stores float32, float16 or bfloat16; Wx has dtype "
                    f"{Wx.dtype} (use backend='reference' for float64)"
                )
            if backend == "fused":
                reason = self.fused_support(head_dim, Wx.dtype)
                if reason is not None:
                    raise TilingError(
                        f"cell '{self.name}': no fused kernel for head dim {head_dim}: {reason}; "
                        "use backend='stepwise' (or 'auto')"
                    )
            return backend
        if backend == "auto" and on_cuda:
            if Wx.dtype not in _CUDA_DTYPES:
                self._warn_once(
                    "reference",
                    f"{Wx.dtype} on {Wx.device} runs on the reference backend (a Python loop "
                    "over time steps); the CUDA backends store float32, float16 or bfloat16",
                )
                return "reference"
            reason = self.fused_support(head_dim, Wx.dtype)
            if reason is None:
                return "fused"
            self._warn_once(
                f"stepwise-{head_dim}-{Wx.dtype}",
                f"no fused kernel for head dim {head_dim} ({reason}); running the stepwise "
                "backend (one matrix product and one kernel launch per step)",
            )
            return "stepwise"
        return "reference"


def _emit(diags: list[Diagnostic], stacklevel: int) -> tuple[Diagnostic, ...]:
    for d in diags:
        warnings.warn(d.render(), RnnccWarning, stacklevel=stacklevel + 1)
    return tuple(diags)


def _load(text: str, cell: str | None, path: str, stacklevel: int) -> CompiledCell:
    cells, diags = compile_source(text, path)
    chosen = select_cell(cells, cell, path, how="cell='name'")
    return CompiledCell(chosen, _emit(diags, stacklevel + 1))


def loads(text: str, cell: str | None = None, *, path: str = "<string>") -> CompiledCell:
    """Compile the cell in ``text`` (or the one named ``cell``); raises ``DslError``."""
    return _load(text, cell, path, stacklevel=2)


def load(path: str | Path, cell: str | None = None) -> CompiledCell:
    """Compile the cell in the file ``path`` (or the one named ``cell``); raises ``DslError``."""
    return _load(Path(path).read_text(encoding="utf-8"), cell, str(path), stacklevel=2)
