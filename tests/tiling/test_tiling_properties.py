"""Property tests: every plan satisfies every named constraint, solving is deterministic, and
on small spaces the solver's feasible set and optimum equal a brute-force enumeration."""

from __future__ import annotations

from dataclasses import replace
from itertools import product

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rnncc.tiling import (
    HardwareCaps,
    Model,
    Point,
    Problem,
    TilingError,
    check_plan,
    feasible_plans,
    solve,
)
from rnncc.tiling.cost import estimate
from rnncc.tiling.hardware import TABLE
from rnncc.tiling.model import MMA_KINDS, VARIABLES
from rnncc.tiling.solve import rank_key, ranked

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def problems(
    draw: st.DrawFn, max_heads: int = 16, max_dim: int = 600, max_batch: int = 300
) -> Problem:
    return Problem(
        gates_r=draw(st.sampled_from([0, 1, 3, 4])),
        heads=draw(st.integers(1, max_heads)),
        head_dim=draw(st.integers(1, max_dim)),
        batch=draw(st.integers(1, max_batch)),
        dtype=draw(st.sampled_from(["fp32", "fp16", "bf16"])),
        n_states=draw(st.integers(1, 4)),
        mufu_ops=draw(st.integers(0, 12)),
        alu_ops=draw(st.integers(0, 30)),
        cell_regs=draw(st.integers(4, 16)),
    )


@st.composite
def small_caps(draw: st.DrawFn) -> HardwareCaps:
    """A made-up GPU small enough to enumerate, with limits tight enough to bind."""
    optin = draw(st.sampled_from([4, 16, 48, 100])) * 1024
    nonportable = draw(st.sampled_from([1, 2, 4]))
    return replace(
        TABLE["h100-sxm"],
        name="tiny",
        sm_count=draw(st.integers(2, 8)),
        gpcs=draw(st.integers(1, 2)),
        regs_per_sm=draw(st.sampled_from([4096, 16384, 65536])),
        smem_per_block_optin=optin,
        smem_per_sm=optin + draw(st.sampled_from([1, 8])) * 1024,
        max_threads_per_sm=draw(st.sampled_from([256, 1024, 2048])),
        max_cluster=min(2, nonportable),
        max_cluster_nonportable=nonportable,
        has_wgmma=draw(st.booleans()),
    )


def _check_plan_fields(plan_problem: Problem, plans: list) -> None:  # type: ignore[type-arg]
    for plan in plans:
        assert check_plan(plan) == []
        for name, used, limit in plan.usage:
            assert used <= limit, name
        p = plan.problem
        assert p == plan_problem
        assert plan.r_reg_bytes_per_block + plan.r_smem_bytes_per_block == plan.r_bytes_per_block
        unit_r = p.gates_r * plan.heads_per_unit * plan.head_dim_padded**2 * p.dtype_bytes
        assert plan.r_bytes_per_block * plan.blocks_per_unit == unit_r  # all of R on chip
        assert plan.head_dim_padded >= p.head_dim
        assert plan.n_chunks * plan.batch_chunk >= p.batch > (plan.n_chunks - 1) * plan.batch_chunk
        assert plan.batch_chunk_padded % MMA_KINDS[plan.mma].n_granule == 0
        assert plan.masked_batch_columns == plan.n_chunks * plan.batch_chunk_padded - p.batch
        assert plan.warps * 32 == plan.threads <= plan.caps.max_threads_per_block
        assert plan.tier == "block" or plan.heads_per_unit == 1
        if plan.tier == "cluster":
            assert 2 <= plan.blocks_per_unit <= plan.caps.max_cluster_nonportable
        if plan.tier == "grid":
            assert plan.blocks_per_unit <= plan.caps.sm_count and plan.blocks_per_sm == 1


@SETTINGS
@given(problem=problems(), key=st.sampled_from(sorted(TABLE)))
def test_every_plan_satisfies_every_constraint(problem: Problem, key: str) -> None:
    caps = TABLE[key]
    try:
        plans = feasible_plans(problem, caps)
    except TilingError as err:
        assert "binding constraints" in str(err)
        return
    costs = [(p.predicted_us_per_step, p.predicted_bwd_us_per_step) for p in plans]
    assert costs == sorted(costs)
    _check_plan_fields(problem, plans)
    assert plans[0] == solve(problem, caps)


@settings(max_examples=15, deadline=None)
@given(problem=problems(), key=st.sampled_from(sorted(TABLE)))
def test_solving_is_deterministic(problem: Problem, key: str) -> None:
    caps = TABLE[key]
    try:
        first = feasible_plans(problem, caps)
    except TilingError as err:
        try:
            feasible_plans(problem, caps)
        except TilingError as again:
            assert str(again) == str(err)
        return
    assert feasible_plans(problem, caps) == first
    assert [p.as_dict() for p in first[:3]] == [
        p.as_dict() for p in feasible_plans(problem, caps)[:3]
    ]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems(max_heads=4, max_dim=96, max_batch=12), caps=small_caps())
def test_solver_equals_brute_force_on_small_spaces(problem: Problem, caps: HardwareCaps) -> None:
    model = Model(problem, caps)
    # Trim the largest domains so that brute force stays fast; both sides use these.
    model.domains = {
        **model.domains,
        "warps_m": (1, 2, 4),
        "warps_k": (1, 2),
        "blocks_per_sm": (1, 2),
    }
    space = product(*(model.domains[v] for v in VARIABLES))
    brute = [
        pt
        for pt in (Point(*values) for values in space)
        if all(c.holds(pt) for c in model.constraints)
    ]
    solved = ranked(model)
    assert {row[1] for row in solved} == set(brute)
    if brute:
        best = min(
            brute,
            key=lambda pt: rank_key(
                model, pt, model.layout(pt), estimate(model, pt, model.layout(pt))
            ),
        )
        assert solved[0][1] == best
