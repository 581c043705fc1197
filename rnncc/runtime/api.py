"""The user-facing cell object: ``rnncc.load(path)`` / ``rnncc.loads(text)`` → ``CompiledCell``.

A ``CompiledCell`` holds the checked forward IR and its derived backward IR and is called
like a function of tensors::

    y, last = cell(
        Wx, R, b, states=None, params=None, backend="auto", lengths=None, reverse=False, mask=None
    )

``lengths`` (``[B]`` integers in ``1 .. T``, any device): row ``b`` runs steps
``0 .. lengths[b]-1``; its outputs at positions ``≥ lengths[b]`` are 0 and its ``last`` holds
the states after its own last step. ``reverse=True``: row ``b`` consumes ``Wx[b, L-1]``, ...,
``Wx[b, 0]`` (``L = lengths[b]``, or ``T``) and the output made while consuming position ``t``
is stored at ``y[:, b, t]``, as in the reverse direction of ``torch.nn.LSTM``. ``reverse`` may
also be one bool per head, reversing the last heads (``[False] * k + [True] * (NH - k)``):
heads are independent recurrences, so a bidirectional ``RNN`` layer runs its two directions as
the two halves of the heads of one call. On the CUDA backends lengths and directions run
inside the kernels: the fused variants' plan (``timeline``) picks kernels built for them.
``mask`` (bool, R's shape ``[Gr, NH, D, D]``, True: kept) makes R sparse: the call runs
``R * mask`` (R's gradient is zero at the dropped entries), and on CUDA the planner may pick
the sparse kernel, which keeps only R's non-zeros on chip (``rnncc.runtime.sparsity``). R may
also be a torch sparse tensor (COO, or CSR, CSC, BSR, BSC per gate and head): its stored
entries are then the mask (``sparsity.sparse_r``).

It validates the inputs (``ValueError`` naming the tensor, the expected and the actual
shape, dtype or device), fills defaults (declared initial states and params, made once per
size and kept: the backends only read them), and on CUDA asks the planner
(``rnncc.tiling.solve``) which kernel variant runs the call; it records what ran in
``last_backend`` and ``last_plan``. Backends: ``"reference"`` (torch ops, any device),
``"stepwise"`` (CUDA: one matrix product and one generated pointwise kernel per step),
``"fused"`` (the cheapest fused variant: one launch per sequence; ``TilingError`` naming the
binding constraints when none runs the size), ``"auto"`` (the reference on CPU; on CUDA the
cheapest variant, with a warning once per cell where that is the stepwise one, so slowness
is never silent). Kernels are built on first use, or by ``prepare``.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from rnncc.autodiff import derive_backward
from rnncc.dump import dump, dump_plan
from rnncc.errors import Diagnostic, RnnccWarning, TilingError
from rnncc.frontend import compile_source, read_source, select_cell
from rnncc.ir.cell import BackwardCell, Cell
from rnncc.ir.printer import print_backward, print_cell
from rnncc.ir.serialize import dump_cells, load_cells
from rnncc.runtime.reference import initial_params, initial_states, run_reference
from rnncc.runtime.sparsity import StripDensities, is_density, masked, sparse_r, validate_mask
from rnncc.runtime.validate import (
    CheckedLengths,
    Sizes,
    functorch_active,
    validate,
    validate_lengths,
    validate_reverse,
)

if TYPE_CHECKING:  # the kernels and the planner are imported on first use, in _run_for
    from rnncc.runtime.kernels import KernelOps
    from rnncc.tiling import HardwareCaps, Plan
    from rnncc.variants.pieces import SlotCounts

BACKENDS = ("auto", "reference", "stepwise", "fused")


def check_backend(backend: object) -> None:
    """A ``ValueError`` naming the backends where ``backend`` is none of them."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")


#: The CUDA backends' storage dtypes, as the planner spells them.
DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
_CUDA_DTYPES = tuple(DTYPE_NAMES)
DEFAULTS_KEPT = 8  # default states/params tensors a cell keeps (the most recently used)


def _may_keep(on_cuda: bool) -> bool:
    """Whether a call may use (and make) the kept default tensors: not while torch.compile or
    export traces (a kept tensor would become a graph constant), nor under a torch dispatch
    mode such as fake tensors or make_fx (one made there belongs to that mode), nor, on CUDA,
    while the current stream captures a graph (one made there lives in the graph's private
    pool; one kept from before could be dropped while the graph still reads it)."""
    if torch.compiler.is_compiling() or is_in_torch_dispatch_mode():
        return False
    return not (on_cuda and torch.cuda.is_current_stream_capturing())


def refuse_torch_func(what: str) -> None:
    """Raise where a torch.func transform (grad, vmap, jacrev, jvp, ...) is active: the
    backends' autograd Functions are not written for them, and torch's own error from inside
    one names none of rnncc's API. ``what``: the call, for the message. Not asked while
    torch.compile traces (the registered ops, with fake implementations, are what it sees)."""
    if not torch.compiler.is_compiling() and functorch_active():
        raise NotImplementedError(
            f"rnncc: {what} does not run under torch.func transforms (grad, vmap, jacrev, "
            "jvp, ...); differentiate with torch.autograd instead (loss.backward() or "
            "torch.autograd.grad)"
        )


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
        #: The plan of the last CUDA call: what it launched (None after a reference call).
        self.last_plan: Plan | None = None
        self._warned: set[Hashable] = set()
        self._plans: dict[tuple[Any, ...], Plan] = {}  # by (device, dtype, B, NH, D, backend)
        self._ops: dict[tuple[str, str], KernelOps] = {}  # by (arch, build record)
        # The same by (device, id(plan)), with the plan (so that its id stays its own).
        self._ops_at: dict[tuple[torch.device, int], tuple[Plan, KernelOps]] = {}
        self._defaults: OrderedDict[tuple[Any, ...], torch.Tensor] = OrderedDict()
        self._decoders: dict[torch.device, KernelOps] = {}
        # A CUDA call's plan by (backend, device, dtype, B, NH, D, timeline), for calls
        # without a mask (whose plan also depends on the mask's densities).
        self._call_plans: dict[tuple[Any, ...], Plan | None] = {}
        self._densities = StripDensities()  # of the masks it is called with

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
        """The shape of every input and output at the given sizes (None: pass None); each
        size a non-negative int (ValueError naming it)."""
        for name, size in (("B", B), ("T", T), ("NH", NH), ("D", D)):
            if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 0:
                raise ValueError(f"{name} must be a non-negative int, got {size!r}")
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

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled (and deep-copied) as its IR in the JSON form of compiled packages: loaded
        # libraries, registered ops and kept default tensors are per process and come back
        # on first use.
        return (from_serialized, (dump_cells(self.ir, self.backward_ir), self.warnings))

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
        *,
        lengths: torch.Tensor | None = None,
        reverse: bool | Sequence[bool] = False,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(y, last)``; the inputs, ``lengths``, ``reverse`` and ``mask`` as in the module
        docstring."""
        return self._call(
            Wx, R, b, states, params, backend, lengths=lengths, reverse=reverse, mask=mask
        )

    def _call(
        self,
        Wx: torch.Tensor,
        R: torch.Tensor | None = None,
        b: torch.Tensor | None = None,
        states: torch.Tensor | None = None,
        params: torch.Tensor | None = None,
        backend: str = "auto",
        *,
        lengths: torch.Tensor | CheckedLengths | None = None,
        reverse: bool | Sequence[bool] = False,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``__call__``, whose ``lengths`` may also be ``CheckedLengths`` (``rnncc.RNN``'s own,
        derived from a ``PackedSequence``: their values are not read)."""
        refuse_torch_func("a cell call")
        check_backend(backend)
        R, mask = sparse_r(R, mask)
        sizes = validate(self.ir, Wx, R, b, states, params)
        reverse_from = validate_reverse(reverse, sizes.NH)
        timeline = lengths is not None or reverse_from < sizes.NH
        if mask is not None:
            mask = validate_mask(mask, R)
            R = masked(R, mask)  # type: ignore[arg-type]  # validate_mask: R is a tensor
        plan = self._call_plan(backend, Wx, sizes, timeline, mask)
        if lengths is not None:  # int32 where the kernels read them
            dtype = torch.int64 if plan is None else torch.int32
            lengths = validate_lengths(lengths, sizes.B, sizes.T, Wx.device, dtype)
        if states is None:
            states = self._declared(sizes, Wx, states=True)
        if params is None and self.ir.params:
            params = self._declared(sizes, Wx, states=False)
        if plan is None:
            self.last_backend, self.last_plan = "reference", None
            return run_reference(
                self.ir,
                self.backward_ir,
                Wx,
                R,
                b,
                states,
                params,
                lengths=lengths,
                reverse_from=reverse_from,
            )
        ops = self._ops_for(Wx.device, plan)  # after the checks: the first call builds
        self.last_backend = "fused" if plan.fused else "stepwise"
        self.last_plan = plan
        return ops(Wx, R, b, states, params, plan.launch, lengths, reverse_from)

    def step(
        self,
        Wx_t: torch.Tensor,
        R: torch.Tensor | None = None,
        b: torch.Tensor | None = None,
        states: torch.Tensor | None = None,
        params: torch.Tensor | None = None,
        backend: str = "auto",
        *,
        out: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One time step: ``(y_t, new_states)`` from ``Wx_t`` ``[B, Gx, NH, D]`` and ``states``
        ``[S, B, NH, D]`` (None: the declared initial states); ``y_t`` is ``[O, B, NH, D]``.
        Differentiable, and ``T`` steps equal one call over ``T`` steps. On CUDA, where no
        gradient is recorded (``torch.no_grad()``, or no input requires grad), it runs the
        decoding kernel: R h and the cell in one launch, written into ``out=(y_t,
        new_states)`` where given (no allocation; ``new_states`` must not be ``states``);
        otherwise the backend's sequence kernels at ``T = 1``."""
        refuse_torch_func("CompiledCell.step")
        if not isinstance(Wx_t, torch.Tensor) or Wx_t.dim() != 4:
            got = f"shape {list(Wx_t.shape)}" if isinstance(Wx_t, torch.Tensor) else "not a tensor"
            raise ValueError(f"Wx_t has {got}, expected [B, Gx={len(self.gx_names)}, NH, D]")
        if Wx_t.shape[1] != len(self.gx_names):  # here: validate would name Wx [B, T, ...]
            raise ValueError(
                f"Wx_t has shape {list(Wx_t.shape)}, expected [B, Gx={len(self.gx_names)}, NH, D] "
                f"(the W x gates of cell '{self.ir.name}': {', '.join(self.gx_names) or 'none'})"
            )
        R, _ = sparse_r(R, None)  # the step runs R's dense form
        check_backend(backend)
        if decodes(backend, Wx_t.device, Wx_t.dtype, lambda: (Wx_t, R, b, states, params)):
            sizes = validate(self.ir, Wx_t.unsqueeze(1), R, b, states, params)
            if states is None:
                states = self._declared(sizes, Wx_t, states=True)
            if params is None and self.ir.params:
                params = self._declared(sizes, Wx_t, states=False)
            B, _, NH, D = sizes
            S, O = len(self.state_names), len(self.outputs)
            if out is None:
                y, new = Wx_t.new_empty(O, B, NH, D), Wx_t.new_empty(S, B, NH, D)
            else:
                kw = {"dtype": Wx_t.dtype, "device": Wx_t.device}
                y, new = check_out(
                    out, ((O, B, NH, D), (S, B, NH, D)), kw, "[O, B, NH, D], [S, B, NH, D]"
                )
            self._decoder(Wx_t.device).decode(None, None, None, Wx_t, R, b, states, params, y, new)
            self.last_backend, self.last_plan = "decode", None
            return y, new
        if out is not None:
            raise no_out(backend, Wx_t.device, Wx_t.dtype)
        y, last = self(Wx_t.unsqueeze(1), R, b, states, params, backend)
        return y[:, :, 0], last

    def _decoder(self, device: torch.device) -> KernelOps:
        """The library with the decoding step for ``device`` (the stepwise one: any size),
        built or loaded on first use (also for ``rnncc.RNN.step``)."""
        found = self._decoders.get(device)
        if found is None:
            plan = self._plan_for(device, torch.float32, Sizes(1, 1, 1, 1), "stepwise")
            found = self._decoders[device] = self._ops_for(device, plan)
        return found

    def _declared(self, sizes: Sizes, Wx: torch.Tensor, *, states: bool) -> torch.Tensor:
        """The declared initial states (``states=True``) or params of a call at ``sizes``, with
        the dtype and device of ``Wx``. Kept across calls (filling them costs a kernel launch
        each, every call): the backends only read them and no caller sees them. Kept per CUDA
        stream, so no call reads a tensor that another stream may still be filling; the
        ``DEFAULTS_KEPT`` most recently used only, so a sweep over sizes holds no memory."""
        B, _, NH, D = sizes
        on_cuda, device = Wx.is_cuda, Wx.device
        if not _may_keep(on_cuda):
            return self._fill(sizes, Wx, states=states)
        stream = torch.cuda.current_stream(device).stream_id if on_cuda else None
        key = (B if states else 0, NH, D, Wx.dtype, device, stream, states)
        kept = self._defaults
        t = kept.pop(key, None)  # and put back last: the most recently used
        if t is not None:
            kept[key] = t
            return t
        # Made outside inference mode, so a later call that records autograd may save it.
        with torch.inference_mode(False):
            t = kept[key] = self._fill(sizes, Wx, states=states)
        while len(kept) > DEFAULTS_KEPT:
            try:
                kept.popitem(last=False)
            except KeyError:  # emptied by another thread
                break
        return t

    def _fill(self, sizes: Sizes, Wx: torch.Tensor, *, states: bool) -> torch.Tensor:
        if states:
            return initial_states(self.ir, sizes.B, sizes.NH, sizes.D, Wx.dtype, Wx.device)
        return initial_params(self.ir, sizes.NH, sizes.D, Wx.dtype, Wx.device)

    def plan(
        self,
        B: int,
        NH: int,
        D: int,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str = "cuda",
        backend: str = "auto",
        *,
        timeline: bool = False,
        density: float = 1.0,
        mask: torch.Tensor | None = None,
    ) -> Plan:
        """The plan a call at these sizes runs on ``device``: the kernel variant, its
        parameters, its launch and predicted cost (``Plan.explain()``). ``backend``:
        ``"auto"`` (the cheapest variant), ``"fused"`` (the cheapest fused one; TilingError
        naming the binding constraints when none runs the size) or ``"stepwise"``.
        ``timeline``: the plan of calls with ``lengths=`` or ``reverse=True``; ``density``:
        of calls with a ``mask=`` keeping this fraction of R in its fullest strip of units
        (``rnncc.runtime.sparsity.strip_density``) and in its fullest piece of one
        (``piece_density``); ``mask``: of calls with this mask (both measured as a call does;
        it overrides ``density``)."""
        if dtype not in _CUDA_DTYPES:
            raise ValueError(f"the CUDA backends store float32, float16 or bfloat16; got {dtype}")
        if backend not in ("auto", "fused", "stepwise"):
            raise ValueError(
                f"plans are for backend 'auto', 'fused' or 'stepwise'; got {backend!r}"
            )
        sizes = Sizes(B, 1, NH, D)
        dev = _cuda_device(device, "cell.plan")
        return self._plan_for(
            dev, dtype, sizes, backend, timeline, self._given(density, mask, dev, NH, D)
        )

    def prepare(
        self,
        device: torch.device | str = "cuda",
        head_dim: int | None = None,
        *,
        dtype: torch.dtype = torch.bfloat16,
        batch: int = 16,
        heads: int = 1,
        timeline: bool = False,
        density: float = 1.0,
        mask: torch.Tensor | None = None,
    ) -> None:
        """Build (or load from the cache) the CUDA kernels for ``device`` now rather than at
        the first call: the stepwise kernels, and with ``head_dim`` those of the plan for
        these sizes (``timeline``: also those of calls with ``lengths=`` or ``reverse=True``;
        ``density``, ``mask``: of calls with a mask, as in ``plan``). Safe to call from several threads
        for different cells at once."""
        dev = _cuda_device(device, "cell.prepare")
        sizes = Sizes(batch, 1, heads, head_dim or 1)
        self._ops_for(dev, self._plan_for(dev, dtype, sizes, "stepwise"))
        if head_dim is not None:
            measured = self._given(density, mask, dev, heads, head_dim)
            self._ops_for(dev, self._plan_for(dev, dtype, sizes, "auto", False, measured))
            if timeline:
                self._ops_for(dev, self._plan_for(dev, dtype, sizes, "auto", True))

    def _arch(self, device: torch.device) -> str:
        from rnncc.runtime.kernels import arch_of

        return arch_of(_index(device))

    def _caps(self, device: torch.device) -> HardwareCaps:
        from rnncc.tiling import caps_for_device

        return caps_for_device(_index(device))

    def _plan_for(
        self,
        device: torch.device,
        dtype: torch.dtype,
        sizes: Sizes,
        backend: str,
        timeline: bool = False,
        density: float | tuple[float, float, SlotCounts | None] = 1.0,
    ) -> Plan:
        """The plan of a call: solved on first use and kept (a device without an index, "the
        current device", is solved for each time). ``density``: R's kept fraction, or a mask's
        (strip, piece) densities and slot counts (``_density``)."""
        B, _, NH, D = sizes
        strip, piece, counts = density if isinstance(density, tuple) else (density, density, None)
        strip, piece = (
            min(1.0, math.ceil(d * 4096) / 4096) for d in (strip, piece)
        )  # masks of about one density share it
        key = (device, dtype, B, NH, D, backend, timeline, strip, piece, counts and counts.key)
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        from rnncc.tiling import Problem, solve
        from rnncc.variants import BY_NAME, VARIANTS

        problem = Problem.from_cell(
            self.ir,
            heads=NH,
            head_dim=D,
            batch=B,
            dtype=DTYPE_NAMES[dtype],
            timeline=timeline,
            density=strip,
            piece_density=piece,
            slot_counts=counts,
        )
        variants = {
            "auto": VARIANTS,
            "fused": tuple(v for v in VARIANTS if v.host == "fused"),
            "stepwise": (BY_NAME["stepwise"],),
        }[backend]
        plan = solve(problem, self._caps(device), variants)
        dump_plan(self.ir.name, plan)
        if device.index is not None:
            self._plans[key] = plan
        return plan

    def _ops_for(self, device: torch.device, plan: Plan) -> KernelOps:
        """The ops that launch ``plan``'s variant on ``device``: built (or loaded from the
        cache) on first use and kept by arch and build record, and by plan."""
        found = self._ops_at.get((device, id(plan)))
        if found is not None and found[0] is plan:
            return found[1]
        from rnncc.runtime.kernels import KernelOps

        arch = self._arch(device)
        key = (arch, json.dumps(plan.build, sort_keys=True))
        ops = self._ops.get(key)
        if ops is None:
            ops = self._ops[key] = KernelOps(self.ir, self.backward_ir, plan.build, arch)
        if device.index is not None:
            self._ops_at[(device, id(plan))] = (plan, ops)
        return ops

    def _warn_once(self, key: Hashable, message: Callable[[], str]) -> None:
        # ``message`` is built only to warn: the fallback it reports runs on every call.
        if key not in self._warned and not torch.compiler.is_compiling():
            self._warned.add(key)
            warnings.warn(f"rnncc: cell '{self.name}': {message()}", RnnccWarning, stacklevel=4)

    def _given(
        self, density: float, mask: torch.Tensor | None, device: torch.device, NH: int, D: int
    ) -> float | tuple[float, float, SlotCounts | None]:
        """What ``plan`` and ``prepare`` plan for: ``mask``'s densities, else ``density``; each
        checked (ValueError naming it) as a call checks its own."""
        if mask is None:
            if isinstance(density, bool) or not isinstance(density, numbers.Real):
                raise ValueError(f"density must be a number in (0, 1], got {density!r}")
            if not is_density(density):
                raise ValueError(f"density must be in (0, 1], got {density!r}")
            return float(density)
        where = mask.device if isinstance(mask, torch.Tensor) else torch.device("cpu")
        shape = (len(self.gr_names), NH, D, D)
        validate_mask(mask, torch.empty((), dtype=torch.bool, device=where).expand(shape))
        return self._density(mask, device, D)

    def _density(
        self, mask: torch.Tensor | None, device: torch.device, D: int
    ) -> tuple[float, float, SlotCounts | None]:
        """The kept fractions of ``mask``'s fullest strip and piece of the sparse kernel's
        blocks on ``device`` and its slot counts (``rnncc.runtime.sparsity``; 1.0 and None
        without a mask)."""
        if mask is None:
            return 1.0, 1.0, None
        from rnncc.variants.grid_sparse import block_units

        return self._densities(mask, block_units(D, self._caps(device).sm_count))

    def _call_plan(
        self,
        backend: str,
        Wx: torch.Tensor,
        sizes: Sizes,
        timeline: bool,
        mask: torch.Tensor | None,
    ) -> Plan | None:
        """A call's plan (``_choose``), kept for CUDA calls without a mask (a mask's densities
        are part of its plan) by what decides it, so that a repeated call's host time before
        its kernel starts is not spent planning again."""
        if mask is not None or not Wx.is_cuda:
            return self._choose(backend, Wx, sizes, timeline, mask)
        key = (backend, Wx.device, Wx.dtype, sizes.B, sizes.NH, sizes.D, timeline)
        try:
            return self._call_plans[key]
        except KeyError:
            pass
        plan = self._choose(backend, Wx, sizes, timeline)
        if not torch.compiler.is_compiling():  # as _warn_once: an eager call warns
            self._call_plans[key] = plan
        return plan

    def _choose(
        self,
        backend: str,
        Wx: torch.Tensor,
        sizes: Sizes,
        timeline: bool = False,
        mask: torch.Tensor | None = None,
    ) -> Plan | None:
        """The plan of a CUDA call, or None where the reference backend runs it; ``timeline``:
        the call has per-row lengths or runs reversed; ``mask``: R's mask, if any."""
        if backend == "reference":
            return None
        on_cuda = Wx.is_cuda
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
            try:
                density = self._density(mask, Wx.device, sizes.D)
                return self._plan_for(Wx.device, Wx.dtype, sizes, backend, timeline, density)
            except TilingError as err:
                raise TilingError(
                    f"cell '{self.name}': no fused kernel for head dim {sizes.D}: {err}\n"
                    "use backend='stepwise' (or 'auto')"
                ) from None
        if not on_cuda:
            return None
        if Wx.dtype not in _CUDA_DTYPES:
            self._warn_once(
                "reference",
                lambda: (
                    f"{Wx.dtype} on {Wx.device} runs on the reference backend (a Python "
                    "loop over time steps); the CUDA backends store float32, float16 or bfloat16"
                ),
            )
            return None
        density = self._density(mask, Wx.device, sizes.D)
        plan = self._plan_for(Wx.device, Wx.dtype, sizes, "auto", timeline, density)
        if not plan.fused:
            self._warn_once(
                ("stepwise", sizes.D, Wx.dtype),
                lambda: (
                    f"no fused kernel for head dim {sizes.D} ({_why_not_fused(plan)}); running "
                    "the stepwise backend (one matrix product and one kernel launch per step)"
                ),
            )
        return plan


def decodes(
    backend: str,
    device: torch.device,
    dtype: torch.dtype,
    inputs: Callable[[], Iterable[torch.Tensor | None]],
) -> bool:
    """Whether a step runs the decoding kernel: on a CUDA backend and a CUDA dtype, recording
    no gradient (none enabled, or none of ``inputs()`` requires one: asked only with
    gradients enabled), outside torch.compile's tracing and torch dispatch modes (which see
    the differentiable ops instead)."""
    if not runs_kernels(backend, device, dtype):
        return False
    if torch.compiler.is_compiling() or is_in_torch_dispatch_mode():
        return False
    return not torch.is_grad_enabled() or not any(
        t is not None and t.requires_grad for t in inputs()
    )


def runs_kernels(backend: str, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a call with ``backend`` on ``device`` in ``dtype`` runs rnncc's CUDA kernels
    (whose backward is first order) rather than the reference backend."""
    return backend != "reference" and device.type == "cuda" and dtype in _CUDA_DTYPES


def no_out(backend: str, device: torch.device, dtype: torch.dtype) -> ValueError:
    """The error for ``out=`` on a step that does not run the decoding kernel, saying which
    of :func:`decodes`' conditions failed."""
    if backend == "reference" or device.type != "cuda":
        why = f"the step runs on {device} with backend={backend!r}; it is a CUDA kernel"
    elif dtype not in _CUDA_DTYPES:
        why = f"it has no {dtype} build"
    elif torch.compiler.is_compiling() or is_in_torch_dispatch_mode():
        why = "torch.compile and dispatch modes trace the step's differentiable ops instead"
    else:
        why = "this step records gradients: call step under torch.no_grad()"
    return ValueError(f"out= is for steps that run the decoding kernel, and {why}")


def check_out(
    out: object, shapes: tuple[tuple[int, ...], ...], like: Mapping[str, Any], legend: str
) -> tuple[torch.Tensor, ...]:
    """``out``: a tuple of tensors of ``shapes`` with ``like``'s ``dtype`` and ``device``, each
    contiguous (ValueError naming what differs). Asked on every decoding step: tensors that
    pass are checked in one expression each."""
    dtype, device = like["dtype"], like["device"]
    if isinstance(out, tuple | list) and len(out) == len(shapes):
        for t, shape in zip(out, shapes):  # a loop, not all() over a generator: every step runs it
            if not (
                type(t) is torch.Tensor
                and t.shape == shape
                and t.dtype == dtype
                and t.device == device
                and t.is_contiguous()
            ):
                break
        else:
            return tuple(out)
    if not isinstance(out, tuple | list) or len(out) != len(shapes):
        raise ValueError(f"out must be a tuple of {len(shapes)} tensors {legend}, got {out!r}")
    for i, (t, shape) in enumerate(zip(out, shapes, strict=True)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
            got = f"shape {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"out[{i}] has {got}, expected {list(shape)} ({legend})")
        if t.dtype != like["dtype"] or t.device != like["device"] or not t.is_contiguous():
            raise ValueError(
                f"out[{i}] must be a contiguous {like['dtype']} tensor on {like['device']}; got "
                f"{t.dtype} on {t.device}{'' if t.is_contiguous() else ', not contiguous'}"
            )
    return tuple(out)


def _cuda_device(device: torch.device | str, what: str) -> torch.device:
    """``device`` as a torch device, a ``ValueError`` where it is no CUDA device (``what``: the
    call, for the message): plans and kernels are for CUDA devices. Whether this process has
    CUDA is asked where the plan needs the device (``_index``)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ValueError(
            f"{what} is for a CUDA device, got {dev}: on the CPU the reference backend runs, "
            "with no plan or kernels ('rnncc plan FILE --arch h100' plans for a GPU)"
        )
    return dev


def _index(device: torch.device) -> int:
    """The CUDA device's index; a ``ValueError`` where this process has no CUDA (torch's own
    is a bare AssertionError from ``current_device``)."""
    if not torch.cuda.is_available():
        raise ValueError(
            f"CUDA is not available in this process (torch {torch.__version__}), so there is "
            f"no {device} to plan or build for; 'rnncc plan FILE --arch h100' plans for a GPU"
        )
    return device.index if device.index is not None else torch.cuda.current_device()


def _why_not_fused(plan: Plan) -> str:
    reasons = [
        f"{a.variant}: {', '.join(a.binding)}" if a.binding else f"{a.variant} costs more"
        for a in plan.alternatives
    ]
    return "; ".join(reasons) or "no fused variant stores this dtype"


def from_serialized(data: dict[str, Any], warnings_: tuple[Diagnostic, ...] = ()) -> CompiledCell:
    """The cell stored by ``rnncc.ir.serialize.dump_cells`` (a package's ``cell.json``, a
    pickle), without running the front end or autodiff."""
    cell, backward = load_cells(data)
    return CompiledCell(cell, warnings_, backward_ir=backward)


def _emit(diags: list[Diagnostic], stacklevel: int) -> tuple[Diagnostic, ...]:
    for d in diags:
        warnings.warn(d.render(), RnnccWarning, stacklevel=stacklevel + 1)
    return tuple(diags)


def _load(
    text: str, cell: str | None, path: str, stacklevel: int, how: str = "cell='name'"
) -> CompiledCell:
    cells, diags = compile_source(text, path)
    chosen = select_cell(cells, cell, path, how=how)
    return CompiledCell(chosen, _emit(diags, stacklevel + 1))


def loads(text: str, cell: str | None = None, *, path: str = "<string>") -> CompiledCell:
    """Compile the cell in ``text`` (or the one named ``cell``); raises ``DslError``."""
    if not isinstance(text, str):  # bytes would fail deep in the lexer
        what = type(text).__name__
        if isinstance(text, bytes | bytearray):
            what += " (decode them first)"
        elif isinstance(text, os.PathLike):
            what += " (rnncc.load reads a file)"
        raise TypeError(f"rnncc.loads takes the cell's source as str, got {what}")
    return _load(text, cell, path, stacklevel=2)


def load(path: str | Path, cell: str | None = None) -> CompiledCell:
    """Compile the cell in the file ``path`` (or the one named ``cell``); raises ``DslError``,
    ``SourceReadError`` (a ``DslError``) when the file cannot be read."""
    return _load(read_source(path), cell, str(path), stacklevel=2)


def load_for_layer(path: str | Path) -> CompiledCell:
    """``load(path)`` for ``rnncc.RNN(path, ...)``, whose file must hold one cell: the error
    for several names the way to choose that works there."""
    how = f"rnncc.RNN(rnncc.load({str(path)!r}, cell='name'), ...)"
    return _load(read_source(path), None, str(path), stacklevel=3, how=how)


def load_builtin(name: str) -> CompiledCell:
    """A built-in cell by name: ``"lstm"``, ``"gru"``, ``"elman"`` (tanh) and ``"elman_relu"``,
    the cells of ``torch.nn.LSTM``, ``GRU`` and ``RNN``; they ship inside the package."""
    from rnncc.resources import builtin_cell_path

    return _load(read_source(builtin_cell_path(name)), None, f"<builtin {name}>", stacklevel=2)
