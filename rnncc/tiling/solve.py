"""Solving: a problem and caps → every feasible plan (python-constraint2), ranked by cost.

Input: ``Problem`` and ``HardwareCaps``. Output: ``feasible_plans`` (ranked, cheapest first)
or ``solve`` (the cheapest); ``TilingError`` when nothing fits, naming the constraints that
bind and the largest head dim that would fit.

The model's variables and named constraints go to python-constraint2 unchanged; its
backtracking solver enumerates every point that satisfies them, and the cost model ranks all
of them. Ties break on a total order of the point (fewer blocks, less R in shared memory,
portable clusters, fewer threads, then the variables themselves), so results are
deterministic.

Invariants: every returned plan satisfies every constraint (``check_plan``); the same
inputs give the same plans in the same order. Non-goals: approximate or incremental solving
(domains are small enough to enumerate).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

import constraint

from rnncc.errors import TilingError
from rnncc.tiling.cost import Cost, estimate
from rnncc.tiling.hardware import HardwareCaps
from rnncc.tiling.model import TIERS, VARIABLES, Layout, Model, Point
from rnncc.tiling.plan import TilingPlan
from rnncc.tiling.problem import Problem

ALL_KINDS = ("structure", "hardware", "dominance")


def csp(
    model: Model,
    *,
    fixed: Mapping[str, Any] | None = None,
    kinds: Iterable[str] = ALL_KINDS,
) -> constraint.Problem:
    """The model as a python-constraint2 problem; ``fixed`` pins variables to one value."""
    wanted = set(kinds)
    fixed = fixed or {}
    problem = constraint.Problem()
    for name in VARIABLES:
        domain = model.domains[name]
        if name in fixed:
            domain = tuple(v for v in domain if v == fixed[name])
        problem.addVariable(name, list(domain))
    # Constraints over the same variables go to the solver as one conjunction: the same
    # solutions with fewer calls (the named constraints stay separate for checks and errors).
    groups: dict[tuple[str, ...], list[Callable[..., bool]]] = {}
    for c in model.constraints:
        if c.kind in wanted:
            groups.setdefault(c.variables, []).append(c.test)
    for variables, tests in groups.items():
        problem.addConstraint(constraint.FunctionConstraint(_conjunction(tests)), list(variables))
    return problem


def _conjunction(tests: list[Callable[..., bool]]) -> Callable[..., bool]:
    if len(tests) == 1:
        return tests[0]
    return lambda *values: all(test(*values) for test in tests)


def points(
    model: Model,
    *,
    fixed: Mapping[str, Any] | None = None,
    kinds: Iterable[str] = ALL_KINDS,
) -> list[Point]:
    """Every point that satisfies the constraints of the given kinds."""
    return [Point.of(s) for s in csp(model, fixed=fixed, kinds=kinds).getSolutions()]


def rank_key(model: Model, point: Point, layout: Layout, cost: Cost) -> tuple[Any, ...]:
    """Cheapest first; a total order, so the ranking is deterministic."""
    nonportable = point.tier == "cluster" and point.blocks_per_unit > model.caps.max_cluster
    return (
        cost.forward_us,
        cost.backward_us,
        layout.total_blocks,
        layout.r_smem_bytes,
        nonportable,
        layout.threads,
        TIERS.index(point.tier),
        point.values(),
    )


def ranked(model: Model) -> list[tuple[tuple[Any, ...], Point, Layout, Cost]]:
    """All feasible points with their layout and cost, cheapest first."""
    rows = []
    for pt in points(model):
        lay = model.layout(pt)
        cost = estimate(model, pt, lay)
        rows.append((rank_key(model, pt, lay, cost), pt, lay, cost))
    rows.sort(key=lambda row: row[0])
    return rows


def feasible_plans(problem: Problem, caps: HardwareCaps) -> list[TilingPlan]:
    """Every feasible plan, cheapest first. TilingError when there is none."""
    model = Model(problem, caps)
    rows = ranked(model)
    if not rows:
        raise infeasible(model)
    return [TilingPlan.build(model, pt, lay, cost) for _, pt, lay, cost in rows]


def solve(problem: Problem, caps: HardwareCaps) -> TilingPlan:
    """The cheapest feasible plan. TilingError when there is none."""
    model = Model(problem, caps)
    rows = ranked(model)
    if not rows:
        raise infeasible(model)
    _, pt, lay, cost = rows[0]
    return TilingPlan.build(model, pt, lay, cost)


def check_plan(plan: TilingPlan) -> list[str]:
    """Names of the constraints the plan violates (empty for every plan solve returns)."""
    return Model(plan.problem, plan.caps).violated(plan.point)


def fits(problem: Problem, caps: HardwareCaps) -> bool:
    """Whether any plan exists (stops at the first one found)."""
    return csp(Model(problem, caps)).getSolution() is not None


# -- diagnosis ----------------------------------------------------------------------------


def diagnose(model: Model, fixed: Mapping[str, Any] | None = None) -> list[str]:
    """The hardware constraints that bind when no point satisfies them all. Among the points
    that satisfy the structure, a constraint every one of them violates binds on its own;
    otherwise the points violating the fewest hardware constraints are the nearest misses,
    and their violations, most frequent first, are the binding constraints."""
    candidates = points(model, fixed=fixed, kinds=("structure", "dominance"))
    if not candidates:
        return []
    misses = [model.violated(pt, kinds=("hardware",)) for pt in candidates]
    order = [c.name for c in model.constraints]
    everywhere = set.intersection(*(set(m) for m in misses))
    if everywhere:  # violated by every candidate: each alone rules the problem out
        return [name for name in order if name in everywhere]
    fewest = min(len(m) for m in misses)
    counts = Counter(name for m in misses if len(m) == fewest for name in m)
    return sorted(counts, key=lambda name: (-counts[name], order.index(name)))


def other_tiers(plan: TilingPlan) -> list[tuple[str, float | None, list[str]]]:
    """For every tier but the plan's: (tier, its best forward µs/step or None, the
    constraints that rule it out when None) — why the plan's tier won."""
    model = Model(plan.problem, plan.caps)
    out: list[tuple[str, float | None, list[str]]] = []
    for tier in model.domains["tier"]:
        if tier == plan.tier:
            continue
        fixed = {"tier": tier}
        best = min(
            (estimate(model, pt, model.layout(pt)).forward_us for pt in points(model, fixed=fixed)),
            default=None,
        )
        out.append((tier, best, [] if best is not None else diagnose(model, fixed=fixed)))
    return out


def _largest(lo: int, hi: int, ok: Any) -> int | None:
    """Largest n in [lo, hi] with ok(n), assuming ok is monotone (true, then false)."""
    if hi < lo or not ok(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def infeasible(model: Model) -> TilingError:
    """The error for a problem without a plan: binding constraints and the largest head dim
    that fits. (Heads and batch never bind: units beyond what the device holds at once run in
    further waves, so the head dim decides.)"""
    p, caps = model.problem, model.caps
    binding = diagnose(model)
    docs = {c.name: c.doc for c in model.constraints}
    lines = [
        f"no tiling plan for {p.describe()} on {caps.name} ({caps.arch}, {caps.sm_count} SMs)",
        "binding constraints:",
    ]
    lines += [f"  {name}: {docs[name]}" for name in binding] or ["  (none found)"]
    if p.gates_r:
        per_sm = caps.regs_per_sm * 4 + caps.smem_per_block_optin
        lines.append(
            f"R is {_mb(p.r_bytes_per_head)} per head ({_mb(p.r_bytes_per_head * p.heads)} in "
            f"all); registers plus shared memory hold at most {_mb(per_sm)} per SM, "
            f"{_mb(per_sm * caps.sm_count)} on the chip"
        )
    step = 8
    largest_d = _largest(
        1, (p.head_dim - 1) // step, lambda n: fits(replace(p, head_dim=n * step), caps)
    )
    if largest_d is None:
        lines.append(f"no head dim fits with NH={p.heads}, B={p.batch}")
    else:
        lines.append(
            f"largest head dim that fits with NH={p.heads}, B={p.batch}: {largest_d * step}"
        )
    return TilingError("\n".join(lines))


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"
