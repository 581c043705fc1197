"""Solving: a problem and caps → every feasible point of every variant, ranked by cost.

Each variant (``rnncc.variants``) that runs the problem's storage dtype gives its parameter
domains and named constraints to python-constraint2, which enumerates the points that satisfy
them; the variant's cost model prices each, and the cheapest wins (ties: the registry's order,
then the point). ``TilingError`` when no variant runs the problem, naming for each variant the
constraints that rule it out. The same inputs give the same plans in the same order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import replace
from functools import partial
from itertools import product
from typing import Any

import constraint

from rnncc.errors import TilingError
from rnncc.tiling.hardware import HardwareCaps
from rnncc.tiling.plan import Alternative, Plan, other_dtypes
from rnncc.tiling.problem import Problem
from rnncc.variants import VARIANTS, Variant


def candidates(problem: Problem, variants: Iterable[Variant] = VARIANTS) -> list[Variant]:
    """The variants that run the problem's storage dtype."""
    return [v for v in variants if problem.dtype in v.dtypes]


def points(variant: Variant, problem: Problem, caps: HardwareCaps) -> list[dict[str, Any]]:
    """Every point of ``variant`` that satisfies its constraints, in a fixed order."""
    if any(not c.holds(problem, caps, {}) for c in variant.constraints if not c.variables):
        return []
    domains = variant.domains(problem, caps)
    if not domains:
        return [{}]
    csp = constraint.Problem()
    for name, values in domains.items():
        csp.addVariable(name, list(values))
    for c in variant.constraints:
        if c.variables:
            test = partial(c.test, problem, caps)
            csp.addConstraint(constraint.FunctionConstraint(test), list(c.variables))
    names = list(domains)
    found = [{n: s[n] for n in names} for s in csp.getSolutions()]
    return sorted(found, key=lambda pt: tuple(pt[n] for n in names))


def violated(
    variant: Variant, problem: Problem, caps: HardwareCaps, point: dict[str, Any]
) -> list[str]:
    return [c.name for c in variant.constraints if not c.holds(problem, caps, point)]


def diagnose(variant: Variant, problem: Problem, caps: HardwareCaps) -> list[str]:
    """The constraints that rule ``variant`` out: those every point violates, else those the
    nearest misses (the points violating the fewest) violate, most frequent first."""
    domains = variant.domains(problem, caps)
    names = list(domains)
    misses = [
        violated(variant, problem, caps, dict(zip(names, values, strict=True)))
        for values in product(*domains.values())
    ]
    order = [c.name for c in variant.constraints]
    everywhere = set.intersection(*(set(m) for m in misses))
    if everywhere:
        return [n for n in order if n in everywhere]
    fewest = min(len(m) for m in misses)
    counts = Counter(n for m in misses if len(m) == fewest for n in m)
    return sorted(counts, key=lambda n: (-counts[n], order.index(n)))


def _plan(variant: Variant, problem: Problem, caps: HardwareCaps, point: dict[str, Any]) -> Plan:
    usage = tuple(
        (c.name, float(used), float(limit))
        for c in variant.constraints
        if c.usage is not None
        for used, limit in [c.usage(problem, caps, point)]
    )
    return Plan(
        problem=problem,
        caps=caps,
        variant=variant.name,
        point=tuple(point.items()),
        backward_point=tuple(point.items()),
        build=variant.build(problem, caps),
        launch=variant.launch(problem, caps, point),
        cost=variant.cost(problem, caps, point),
        usage=usage,
    )


def feasible_plans(
    problem: Problem, caps: HardwareCaps, variants: Sequence[Variant] = VARIANTS
) -> list[Plan]:
    """Every feasible point of every variant as a plan, cheapest first."""
    order = {v.name: i for i, v in enumerate(variants)}
    plans = [
        _plan(v, problem, caps, pt)
        for v in candidates(problem, variants)
        for pt in points(v, problem, caps)
    ]
    plans.sort(key=lambda p: (p.cost.forward_us, p.cost.backward_us, order[p.variant], p.point))
    return plans


def solve(problem: Problem, caps: HardwareCaps, variants: Sequence[Variant] = VARIANTS) -> Plan:
    """The cheapest plan among ``variants`` (default: all), with the others' best costs or
    binding constraints as its alternatives. ``TilingError`` when none runs the problem."""
    plans = feasible_plans(problem, caps, variants)
    if not plans:
        raise infeasible(problem, caps, variants)
    best = with_cheapest_backward(plans[0], plans)
    alternatives = []
    for v in candidates(problem, variants):
        if v.name == best.variant:
            continue
        mine = [p for p in plans if p.variant == v.name]
        if mine:
            alternatives.append(Alternative(v.name, mine[0].cost.forward_us))
        else:
            alternatives.append(Alternative(v.name, None, tuple(diagnose(v, problem, caps))))
    return replace(best, alternatives=tuple(alternatives))


def with_cheapest_backward(best: Plan, plans: Sequence[Plan]) -> Plan:
    """``best`` with the backward of its variant's point whose backward is cheapest (the first
    in ``plans``' order among equals), where that point shares its exchange buffer: the
    forward and the backward are separate launches, each reading only what the other leaves in
    memory whatever its point (the saved states, and a fresh exchange buffer each call)."""

    def exchange(plan: Plan) -> Any:  # the launch's buffer, past its two kernels
        return replace(plan.launch, forward=None, backward=None)

    mine = exchange(best)
    same = [p for p in plans if p.variant == best.variant and exchange(p) == mine]
    other = min(same, key=lambda p: p.cost.backward_us)
    if other.cost.backward_us >= best.cost.backward_us:
        return best
    return replace(
        best,
        backward_point=other.point,
        launch=replace(best.launch, backward=other.launch.backward),
        cost=replace(best.cost, backward_us=other.cost.backward_us),
    )


def infeasible(
    problem: Problem, caps: HardwareCaps, variants: Sequence[Variant] = VARIANTS
) -> TilingError:
    """The error for a problem no variant runs: each variant and its binding constraints."""
    lines = [f"no kernel variant runs {problem.describe()} on {caps.name} ({caps.sm_count} SMs)"]
    runs = candidates(problem, variants)
    if not runs:
        names = ", ".join(v.name for v in variants)
        lines.append(f"  none of {names} stores {problem.dtype}")
    for v in runs:
        docs = {c.name: c.doc for c in v.constraints}
        lines.append(f"  {v.name}: ruled out by")
        lines += [f"    {n}: {docs[n]}" for n in diagnose(v, problem, caps)]
    if runs:
        lines += [f"  {line}" for line in other_dtypes(problem, variants)]
    return TilingError("\n".join(lines))
