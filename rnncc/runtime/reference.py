"""The reference backend: the cell IR run step by step with torch ops, on any device.

Forward: per step ``g = Wx[t] + R·h[t-1] + b`` (per head, ``R`` out × in), then the cell's
update expressions through the IR interpreter. Backward (an ``autograd.Function``): the
derived backward cell, run in reverse over the saved per-step states, with the recurrent
path ``Rᵀ·dg`` added to the recurrent state's cotangent, ``dR = Σ_t dgᵀ h[t-1]``,
``db = Σ_{t,B} dg`` and the params' cotangents reduced over batch and time. So every later
backend is checked against the backward IR, not against torch autograd.

Per-row lengths and the reverse direction: a row of length ``L`` runs steps ``0 .. L-1``
and keeps its states after them (their outputs are 0); the backward passes a state's cotangent
unchanged through the steps past a row's length, with zero gate and param cotangents there.
The reverse direction is a per-row permutation of the time axis, applied to the reversed
heads' ``Wx`` on the way in and ``y`` on the way out (``step_order``), so the masked
recurrence is the only loop.

Double backward: under ``create_graph=True`` the backward recomputes the forward from the
saved inputs with autograd on and runs the backward cell on that graph, so its results are
differentiable (second-order gradients, gradient penalties) in terms of the inputs.

Precision: float64 inputs compute in float64; float32, float16 and bfloat16 inputs compute
in float32 (like the kernels) and round results to the storage dtype.
"""

from __future__ import annotations

from typing import Any, cast, overload

import torch

from rnncc.ir.cell import BackwardCell, Cell
from rnncc.ir.interpret import evaluate
from rnncc.runtime.validate import autocast_off, refuse_batched_backward


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


@overload
def _to(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor: ...
@overload
def _to(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None: ...
def _to(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    return None if t is None else t.to(dtype)


def _filled(
    values: list[float], shape: tuple[int, ...], dtype: torch.dtype, device: Any
) -> torch.Tensor:
    # Fills, no host-to-device copy: capturable in a CUDA graph. One fill when the values are
    # equal (the usual zeros), else one per value.
    if len(set(values)) <= 1:
        return torch.full(
            (len(values), *shape), values[0] if values else 0.0, dtype=dtype, device=device
        )
    out = torch.empty((len(values), *shape), dtype=dtype, device=device)
    for k, v in enumerate(values):
        out[k].fill_(v)
    return out


def initial_states(
    cell: Cell, B: int, NH: int, D: int, dtype: torch.dtype, device: Any
) -> torch.Tensor:
    """``[S, B, NH, D]`` filled with each state's declared initial value."""
    return _filled([s.init for s in cell.states], (B, NH, D), dtype, device)


def initial_params(cell: Cell, NH: int, D: int, dtype: torch.dtype, device: Any) -> torch.Tensor:
    """``[P, NH, D]`` filled with each param's declared initial value."""
    return _filled([p.init for p in cell.params], (NH, D), dtype, device)


def step_order(lengths: torch.Tensor | None, B: int, T: int, device: Any) -> torch.Tensor:
    """``[B, T]``: the position of ``Wx`` that row ``b`` consumes at step ``t`` in the reverse
    direction, ``L_b - 1 - t`` for ``t < L_b`` and ``t`` past the row's length. The map is its
    own inverse, so it also carries ``y`` from step order back to positions."""
    t = torch.arange(T, device=device).expand(B, T)
    if lengths is None:
        return t.flip(1)
    L = lengths.view(B, 1)
    return torch.where(t < L, L - 1 - t, t)


def _by_position(x: torch.Tensor, order: torch.Tensor, dim: int) -> torch.Tensor:
    """``x`` with its time axis ``dim`` (the axis after the batch axis) permuted per row."""
    index = order.view(*([1] * (dim - 1)), *order.shape, *([1] * (x.dim() - dim - 1)))
    return torch.take_along_dim(x, index, dim=dim)


def _heads_in_order(
    x: torch.Tensor, order: torch.Tensor | None, dim: int, first: int
) -> torch.Tensor:
    """``x`` (``Wx`` or ``y``: time at axis ``dim``, heads at ``-2``) with the time axis of
    heads ``first ..`` permuted per row by ``order`` (None: no head is reversed)."""
    if order is None:
        return x
    if first == 0:
        return _by_position(x, order, dim)
    kept, turned = x.split([first, x.shape[-2] - first], dim=-2)
    return torch.cat([kept, _by_position(turned, order, dim)], dim=-2)


def _active(lengths: torch.Tensor | None, t: int) -> torch.Tensor | None:
    """``[B, 1, 1]``: whether each row still runs at step ``t`` (None: every row does)."""
    return None if lengths is None else (t < lengths).view(-1, 1, 1)


class _Step:
    """Gate assembly and leaf binding for one cell at one set of sizes."""

    def __init__(
        self,
        cell: Cell,
        Wx: torch.Tensor,
        R: torch.Tensor | None,
        b: torch.Tensor | None,
        params: torch.Tensor | None,
        cdtype: torch.dtype,
    ) -> None:
        self.cell = cell
        self.Wx, self.R, self.b, self.params = Wx, R, b, params
        self.cdtype = cdtype
        self.ix, self.ir, self.ib = (cell.part_index(p) for p in ("x", "r", "b"))
        self.rec = cell.state_names.index(cell.recurrent) if cell.recurrent else None

    def gates(self, t: int, states: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        rh = None
        if self.rec is not None:
            # R [Gr, NH, D_out, D_in] · h [B, NH, D_in] -> [Gr, B, NH, D_out]
            rh = torch.einsum("gnde,bne->gbnd", self.R, states[self.rec])
        out: dict[str, torch.Tensor] = {}
        for gate in self.cell.gates:
            v: torch.Tensor | None = None
            if gate.name in self.ix:
                v = self.Wx[:, t, self.ix[gate.name]]
            if rh is not None and gate.name in self.ir:
                v = rh[self.ir[gate.name]] if v is None else v + rh[self.ir[gate.name]]
            if gate.name in self.ib:
                assert self.b is not None  # b terms make b a required input (validate)
                bias = self.b[self.ib[gate.name]]
                v = bias.expand_as(states[0]) if v is None else v + bias
            # Every projection has at least one term (the grammar needs one), and R terms
            # imply a recurrent state (the verifier checks it), so every gate got a value.
            assert v is not None
            out[gate.name] = v
        return out

    def leaves(self, t: int, states: list[torch.Tensor]) -> dict[tuple[str, str], torch.Tensor]:
        leaves: dict[tuple[str, str], torch.Tensor] = {
            ("state", s): v for s, v in zip(self.cell.state_names, states, strict=True)
        }
        leaves.update((("gate", g), v) for g, v in self.gates(t, states).items())
        if self.params is not None:
            leaves.update(
                (("param", p), self.params[k]) for k, p in enumerate(self.cell.param_names)
            )
        return leaves


def _run_forward(
    cell: Cell,
    Wx: torch.Tensor,
    R: torch.Tensor | None,
    b: torch.Tensor | None,
    states: torch.Tensor,
    params: torch.Tensor | None,
    lengths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, list[list[torch.Tensor]], _Step]:
    cdtype = compute_dtype(Wx.dtype)
    Wx_c, R_c, b_c, p_c = _to(Wx, cdtype), _to(R, cdtype), _to(b, cdtype), _to(params, cdtype)
    step = _Step(cell, Wx_c, R_c, b_c, p_c, cdtype)
    cur = [s.to(cdtype) for s in states.unbind(0)]
    B, T, _, NH, D = Wx.shape
    out_idx = [cell.state_names.index(s) for s in cell.outputs]
    ys: list[torch.Tensor] = []
    history: list[list[torch.Tensor]] = []
    roots = [n for _, n in cell.updates]
    for t in range(T):
        history.append(cur)
        new = [
            v.expand(B, NH, D)
            for v in evaluate(roots, step.leaves(t, cur), dtype=cdtype, device=Wx.device)
        ]
        active = _active(lengths, t)
        if active is None:
            cur = new
            ys.append(torch.stack([cur[k] for k in out_idx]))
        else:  # rows past their length keep their states and output 0
            cur = [torch.where(active, n, c) for n, c in zip(new, cur, strict=True)]
            ys.append(torch.stack([torch.where(active, new[k], 0.0) for k in out_idx]))
    if ys:
        y = torch.stack(ys, dim=2)
    else:
        y = Wx.new_zeros((len(out_idx), B, 0, NH, D), dtype=cdtype)
    last = torch.stack(cur)
    return y, last, history, step


class ReferenceFunction(torch.autograd.Function):
    """Forward through the IR interpreter; backward through the derived backward cell."""

    @staticmethod
    def forward(
        ctx: Any,
        cell: Cell,
        bwd: BackwardCell,
        Wx: torch.Tensor,
        R: torch.Tensor | None,
        b: torch.Tensor | None,
        states: torch.Tensor,
        params: torch.Tensor | None,
        lengths: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        y, last, history, _ = _run_forward(cell, Wx, R, b, states, params, lengths)
        ctx.cell, ctx.bwd = cell, bwd
        ctx.history = history
        ctx.lengths = lengths
        ctx.save_for_backward(Wx, R, b, states, params)
        ctx.states_dtype = states.dtype
        return y.to(Wx.dtype), last.to(Wx.dtype)

    @staticmethod
    def backward(
        ctx: Any, dy: torch.Tensor | None, dlast: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        refuse_batched_backward(dy, dlast)
        cell: Cell = ctx.cell
        bwd: BackwardCell = ctx.bwd
        Wx, R, b, states, params = ctx.saved_tensors
        history: list[list[torch.Tensor]] = ctx.history
        lengths: torch.Tensor | None = ctx.lengths
        if torch.is_grad_enabled():
            # create_graph=True: the forward's history was computed without autograd; redo it
            # on the saved inputs so that the backward below is differentiable in them.
            _, _, history, _ = _run_forward(cell, Wx, R, b, states, params, lengths)
        cdtype = compute_dtype(Wx.dtype)
        step = _Step(
            cell, _to(Wx, cdtype), _to(R, cdtype), _to(b, cdtype), _to(params, cdtype), cdtype
        )
        B, T, _, NH, D = Wx.shape
        shape = (B, NH, D)
        S = len(cell.states)
        ds = [
            torch.zeros(shape, dtype=cdtype, device=Wx.device)
            if dlast is None
            else dlast[k].to(cdtype)
            for k in range(S)
        ]
        dWx = torch.zeros(Wx.shape, dtype=cdtype, device=Wx.device)
        dR = None if R is None else torch.zeros(R.shape, dtype=cdtype, device=Wx.device)
        db = None if b is None else torch.zeros(b.shape, dtype=cdtype, device=Wx.device)
        dp = None if params is None else torch.zeros(params.shape, dtype=cdtype, device=Wx.device)
        ix, ib = step.ix, step.ib
        rec = step.rec
        roots = list(bwd.roots)
        ns, ng = len(bwd.d_states), len(bwd.d_gates)
        for t in reversed(range(T)):
            old = history[t]
            leaves = step.leaves(t, old)
            leaves.update((("dstate", s), ds[k]) for k, s in enumerate(cell.state_names))
            for k, s in enumerate(cell.outputs):
                leaves[("dout", s)] = (
                    torch.zeros(shape, dtype=cdtype, device=Wx.device)
                    if dy is None
                    else dy[k, :, t].to(cdtype)
                )
            outs = [
                v.expand(shape) for v in evaluate(roots, leaves, dtype=cdtype, device=Wx.device)
            ]
            d_old, d_g, d_p = outs[:ns], outs[ns : ns + ng], outs[ns + ng :]
            active = _active(lengths, t)
            if active is not None:
                # A row past its length did not run this step: its states passed through.
                d_old = [torch.where(active, d, s) for d, s in zip(d_old, ds, strict=True)]
                d_g = [torch.where(active, d, 0.0) for d in d_g]
                d_p = [torch.where(active, d, 0.0) for d in d_p]
            dg = dict(zip((g for g, _ in bwd.d_gates), d_g, strict=True))
            for g, k in ix.items():
                dWx[:, t, k] = dg[g]
            if rec is not None:
                dgr = torch.stack([dg[g] for g in cell.gr_names])  # [Gr, B, NH, D]
                assert dR is not None  # a recurrent state implies R (validated on the call)
                dR += torch.einsum("gbnd,bne->gnde", dgr, old[rec])
                d_old[rec] = d_old[rec] + torch.einsum("gnde,gbnd->bne", step.R, dgr)
            if db is not None:
                for g, k in ib.items():
                    db[k] += dg[g].sum(0)
            if dp is not None:
                for k, v in enumerate(d_p):
                    dp[k] += v.sum(0)
            ds = d_old
        dstates = torch.stack(ds).to(ctx.states_dtype)
        return (
            None,
            None,
            dWx.to(Wx.dtype),
            None if dR is None else dR.to(R.dtype),
            None if db is None else db.to(b.dtype),
            dstates,
            None if dp is None else dp.to(params.dtype),
            None,
        )


def forward_autograd(
    cell: Cell,
    Wx: torch.Tensor,
    R: torch.Tensor | None,
    b: torch.Tensor | None,
    states: torch.Tensor,
    params: torch.Tensor | None,
    *,
    lengths: torch.Tensor | None = None,
    reverse_from: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y, last)`` computed with plain differentiable torch ops: torch autograd through the
    forward, the oracle that the derived backward is tested against; heads ``reverse_from ..``
    run reversed (None: none)."""
    order = _order(Wx, lengths, reverse_from)
    first = reverse_from or 0
    Wx = _heads_in_order(Wx, order, 1, first)
    y, last, _, _ = _run_forward(cell, Wx, R, b, states, params, lengths)
    return _heads_in_order(y, order, 2, first).to(Wx.dtype), last.to(Wx.dtype)


def run_reference(
    cell: Cell,
    bwd: BackwardCell,
    Wx: torch.Tensor,
    R: torch.Tensor | None,
    b: torch.Tensor | None,
    states: torch.Tensor,
    params: torch.Tensor | None,
    *,
    lengths: torch.Tensor | None = None,
    reverse_from: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y, last)`` of the reference backend; inputs already validated and defaulted,
    ``lengths`` an int64 tensor on ``Wx``'s device (or None: every row runs ``T`` steps), heads
    ``reverse_from ..`` reversed (None: none)."""
    order = _order(Wx, lengths, reverse_from)
    first = reverse_from or 0
    # in the inputs' dtypes, as the CUDA backends: autocast would run the products in 16 bits
    with autocast_off(Wx.device.type):
        out = ReferenceFunction.apply(
            cell, bwd, _heads_in_order(Wx, order, 1, first), R, b, states, params, lengths
        )
    y, last = cast(tuple[torch.Tensor, torch.Tensor], out)
    return _heads_in_order(y, order, 2, first), last


def _order(
    Wx: torch.Tensor, lengths: torch.Tensor | None, reverse_from: int | None
) -> torch.Tensor | None:
    """``step_order`` of a call where some head runs reversed, else None."""
    if reverse_from is None or reverse_from >= Wx.shape[3]:
        return None
    return step_order(lengths, Wx.shape[0], Wx.shape[1], Wx.device)
