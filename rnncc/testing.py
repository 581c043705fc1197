"""Numerical checking helpers: random inputs for a cell and comparisons with float64 oracles.

Used by rnncc's own tests (CPU and GPU) and usable by anyone checking a cell of their own:

- ``rel_err(a, b)`` — ‖a − b‖ / ‖b‖ in float64 (NaN anywhere gives inf: NaN never passes);
- ``random_inputs(cell, B, T, NH, D, ...)`` — ``Wx, R, b, states, params`` of the right shapes,
  never zeros, scaled so that long sequences stay bounded;
- ``step_leaves(cell, shape, ...)`` — random values for every leaf of one step;
- ``backward_vs_autograd(cell, ...)`` — the largest difference between the derived backward
  cell and torch autograd through the forward interpreter, on one step.
"""

from __future__ import annotations

import math
from typing import Any, cast

import torch

from rnncc.autodiff import derive_backward
from rnncc.ir.cell import Cell
from rnncc.ir.interpret import evaluate

#: Relative-error tolerances per storage dtype, for kernels against the float64 reference.
TOLERANCES = {
    torch.float64: 1e-10,
    torch.float32: 1e-5,
    torch.float16: 2e-2,
    torch.bfloat16: 2e-2,
}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖ in float64; inf when either holds a NaN; 0 when both are zero."""
    a64 = a.detach().to(torch.float64).cpu()
    b64 = b.detach().to(torch.float64).cpu()
    if torch.isnan(a64).any() or torch.isnan(b64).any():
        return math.inf
    num = torch.linalg.vector_norm(a64 - b64).item()
    den = torch.linalg.vector_norm(b64).item()
    return 0.0 if num == 0.0 else (num / den if den > 0 else math.inf)


def _positive_states(cell: Cell) -> set[str]:
    """States that a cell divides by or takes the log of (heuristic: sLSTM's normaliser n and
    any state initialised to a non-zero value), kept positive in random inputs."""
    return {s.name for s in cell.states if s.init != 0.0 and math.isfinite(s.init)} | (
        {"n"} if "n" in cell.state_names else set()
    )


def random_inputs(
    cell: Cell,
    B: int,
    T: int,
    NH: int,
    D: int,
    *,
    dtype: torch.dtype = torch.float64,
    device: Any = "cpu",
    seed: int = 0,
    positive_states: set[str] | None = None,
) -> dict[str, torch.Tensor | None]:
    """Random ``Wx, R, b, states, params`` for ``cell`` at the given sizes.

    ``R`` is scaled by 1/√D so activations stay O(1) over long sequences; states listed in
    ``positive_states`` (default: a heuristic, see ``_positive_states``) are drawn from
    [0.5, 1.5] so that cells dividing by them stay finite."""
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    gx, gr, gb = len(cell.gx_names), len(cell.gr_names), len(cell.gb_names)
    S, P = len(cell.states), len(cell.params)
    positive = _positive_states(cell) if positive_states is None else positive_states
    states = rnd(S, B, NH, D)
    for k, s in enumerate(cell.state_names):
        if s in positive:
            states[k] = 0.5 + torch.rand(B, NH, D, generator=g, dtype=torch.float64)
    out: dict[str, torch.Tensor | None] = {
        "Wx": rnd(B, T, gx, NH, D),
        "R": rnd(gr, NH, D, D) / math.sqrt(D) if gr else None,
        "b": 0.1 * rnd(gb, NH, D) if gb else None,
        "states": states,
        "params": 0.5 * rnd(P, NH, D) if P else None,
    }
    return {k: None if v is None else v.to(dtype=dtype, device=device) for k, v in out.items()}


def step_leaves(
    cell: Cell, shape: tuple[int, ...], *, seed: int = 0, positive_states: set[str] | None = None
) -> dict[tuple[str, str], torch.Tensor]:
    """Random float64 values for every leaf of one forward step of ``cell``."""
    g = torch.Generator().manual_seed(seed)
    positive = _positive_states(cell) if positive_states is None else positive_states
    leaves: dict[tuple[str, str], torch.Tensor] = {}
    for s in cell.state_names:
        v = torch.randn(shape, generator=g, dtype=torch.float64)
        leaves[("state", s)] = v.abs() + 0.5 if s in positive else v
    for gate in cell.gates:
        leaves[("gate", gate.name)] = torch.randn(shape, generator=g, dtype=torch.float64)
    for p in cell.param_names:
        leaves[("param", p)] = torch.randn(shape, generator=g, dtype=torch.float64)
    return leaves


def backward_vs_autograd(
    cell: Cell,
    leaves: dict[tuple[str, str], torch.Tensor],
    *,
    seed: int = 1,
) -> float:
    """Largest relative difference |derived − autograd| / (1 + |autograd|), elementwise, over
    every cotangent of one step (derived backward cell against torch autograd).

    Autograd runs through the forward interpreter (the op table's torch references), with
    random cotangents for the new states and the outputs; the derived backward cell gets the
    same cotangents as its ``dstate``/``dout`` leaves. NaN in either gives inf."""
    g = torch.Generator().manual_seed(seed)
    shape = next(iter(leaves.values())).shape
    inputs = {k: v.detach().clone().requires_grad_(True) for k, v in leaves.items()}
    roots = [n for _, n in cell.updates]
    new = evaluate(roots, inputs, dtype=torch.float64)
    d_new = {s: torch.randn(shape, generator=g, dtype=torch.float64) for s in cell.state_names}
    d_out = {s: torch.randn(shape, generator=g, dtype=torch.float64) for s in cell.outputs}
    # A tensor, not sum()'s start value 0: every cell has at least one state.
    loss = cast(
        torch.Tensor,
        sum(
            (v.expand(shape) * (d_new[s] + d_out.get(s, 0.0))).sum()
            for (s, _), v in zip(cell.updates, new, strict=True)
        ),
    )
    keys = list(inputs)
    grads = torch.autograd.grad(loss, [inputs[k] for k in keys], allow_unused=True)
    expected = dict(zip(keys, grads, strict=True))

    bwd = derive_backward(cell)
    bl: dict[tuple[str, str], torch.Tensor] = {k: v.detach() for k, v in leaves.items()}
    bl.update((("dstate", s), v) for s, v in d_new.items())
    bl.update((("dout", s), v) for s, v in d_out.items())
    got = evaluate(bwd.roots, bl, dtype=torch.float64)
    names = (
        [("state", s) for s, _ in bwd.d_states]
        + [("gate", n) for n, _ in bwd.d_gates]
        + [("param", n) for n, _ in bwd.d_params]
    )
    worst = 0.0
    for key, value in zip(names, got, strict=True):
        ref = expected.get(key)
        ref = torch.zeros(shape, dtype=torch.float64) if ref is None else ref
        diff = (value.expand(shape) - ref).abs() / (1.0 + ref.abs())
        if torch.isnan(diff).any():
            return math.inf
        worst = max(worst, float(diff.max()))
    return worst


def pairwise(factors: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """A small set of combinations that covers every pair of values of every two factors
    (greedy all-pairs), deterministic. Use it to sample a size matrix too large to run whole."""
    names = list(factors)
    uncovered = {
        (a, va, b, vb)
        for i, a in enumerate(names)
        for b in names[i + 1 :]
        for va in factors[a]
        for vb in factors[b]
    }
    rows: list[dict[str, Any]] = []
    while uncovered:
        a, va, b, vb = min(uncovered, key=lambda p: (names.index(p[0]), names.index(p[2]), repr(p)))
        row = {a: va, b: vb}
        for name in names:
            if name in row:
                continue

            def gain(v: Any, name: str = name, row: dict[str, Any] = row) -> int:
                return sum(
                    1
                    for other, ov in row.items()
                    if (name, v, other, ov) in uncovered or (other, ov, name, v) in uncovered
                )

            row[name] = max(factors[name], key=lambda v: (gain(v), -factors[name].index(v)))
        for i, x in enumerate(names):
            for y in names[i + 1 :]:
                uncovered.discard((x, row[x], y, row[y]))
        rows.append({n: row[n] for n in names})
    return rows
