"""Property tests over random problems and devices: every plan satisfies its variant's
constraints, the solver finds exactly the points that do, plans are ranked by cost and
reproducible, and every launch covers the problem the way the kernels read it."""

from __future__ import annotations

from dataclasses import replace
from itertools import product

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rnncc.tiling import HardwareCaps, Plan, Problem, feasible_plans, solve
from rnncc.tiling.hardware import TABLE
from rnncc.tiling.solve import points
from rnncc.variants import BY_NAME, VARIANTS

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Head dims where the variants' limits fall: block tiers end at 64 (fp32) and 64 to 128
# (16-bit), wide grid blocks at 768, narrow ones at 8 × the SM count.
EDGES = [63, 64, 65, 127, 128, 129, 767, 768, 769, 912, 913, 1023, 1024, 1025, 1056, 1057]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@st.composite
def problems(draw: st.DrawFn) -> Problem:
    gates_r = draw(st.sampled_from([0, 1, 2, 3, 4, 6]))
    return Problem(
        gates_r=gates_r,
        heads=draw(st.integers(1, 24)),
        head_dim=draw(st.one_of(st.integers(1, 160), st.sampled_from(EDGES), st.integers(1, 2100))),
        batch=draw(st.integers(1, 300)),
        dtype=draw(st.sampled_from(["fp32", "fp16", "bf16"])),
        n_states=draw(st.integers(1, 4)),
        gates_x=draw(st.integers(0, 4)),
        gates_b=draw(st.integers(0, gates_r)),
        n_params=draw(st.integers(0, 3)),
        n_outputs=draw(st.integers(1, 2)),
        mufu_ops=draw(st.integers(0, 12)),
        alu_ops=draw(st.integers(0, 30)),
        cell_regs=draw(st.integers(4, 16)),
    )


@st.composite
def devices(draw: st.DrawFn) -> HardwareCaps:
    """A known GPU, or one with fewer SMs (a MIG slice, a cut-down part)."""
    caps = TABLE[draw(st.sampled_from(sorted(TABLE)))]
    if draw(st.booleans()):
        caps = replace(caps, name="slice", sm_count=draw(st.integers(1, caps.sm_count)))
    return caps


def _check_launch(plan: Plan) -> None:
    """The launch as the kernels check it (``planned`` in templates/block_*.cuh, grid_mma.cuh)."""
    p, caps, build = plan.problem, plan.caps, plan.build
    fw, bw = plan.launch.forward, plan.launch.backward
    if plan.variant == "stepwise":
        assert fw is None and bw is None and plan.launch.as_list() == []
        return
    assert fw is not None and bw is not None
    assert fw.grid == bw.grid and fw.launches == bw.launches and fw.kernel == bw.kernel
    for k in (fw, bw):
        assert k.threads % 32 == 0 and k.threads <= caps.max_threads_per_block
        assert k.smem <= caps.smem_per_block_optin
    if plan.variant in ("block_ffma", "block_mma"):
        # One block per (head, 8 batch rows), all in one launch.
        assert fw.grid == (p.heads, cdiv(p.batch, 8), 1)
        assert (fw.kernel, fw.launches, fw.smem) == (0, 1, 0)
        assert fw.threads == bw.threads == build["threads"]
        ring = build["ring"]["bytes"] if plan.variant == "block_mma" else 0
        assert bw.smem == ring
        return
    assert plan.variant in ("grid_mma", "grid_stream")
    nt, uw = dict(plan.point)["n_tiles"], dict(plan.point)["unit_tiles"]
    x, y, z = fw.grid
    chunks = cdiv(p.batch, 8 * nt)
    assert x == cdiv(cdiv(p.head_dim, 8), uw) and x * 8 * uw >= p.head_dim
    assert 1 <= y <= p.heads and 1 <= z <= chunks
    # The host loops over heads by y and chunks by z; every launch is cooperative.
    assert fw.launches == cdiv(p.heads, y) * cdiv(chunks, z)
    assert x * y * z <= dict(plan.point)["blocks_per_sm"] * caps.sm_count
    kernel = build["kernels"][fw.kernel]
    assert (kernel["n_tiles"], kernel["unit_tiles"]) == (nt, uw)
    assert (kernel["fw_threads"], kernel["fw_smem"]) == (fw.threads, fw.smem)
    assert (kernel["bw_threads"], kernel["bw_smem"]) == (bw.threads, bw.smem)
    assert plan.launch.exchange_words == build["exchange_words"]


@SETTINGS
@given(problem=problems(), caps=devices())
def test_every_plan_satisfies_its_variant_and_covers_the_problem(
    problem: Problem, caps: HardwareCaps
) -> None:
    plans = feasible_plans(problem, caps)
    assert plans, "stepwise runs every problem"
    for plan in plans:
        variant = BY_NAME[plan.variant]
        point = dict(plan.point)
        assert problem.dtype in variant.dtypes
        broken = [c.name for c in variant.constraints if not c.holds(problem, caps, point)]
        assert broken == [], (plan.summary(), broken)
        for name, used, limit in plan.usage:
            assert used <= limit, (plan.summary(), name)
        assert plan.problem == problem and plan.caps == caps
        _check_launch(plan)
    costs = [(p.cost.forward_us, p.cost.backward_us) for p in plans]
    assert costs == sorted(costs)
    best = solve(problem, caps)
    assert (best.variant, best.point, best.launch.forward) == (
        plans[0].variant,
        plans[0].point,
        plans[0].launch.forward,
    )
    # the backward: the variant's cheapest backward, a point's own launch of it
    mine = [p for p in plans if p.variant == best.variant]
    assert best.cost.backward_us == min(p.cost.backward_us for p in mine)
    runs = next(p for p in mine if p.point == best.backward_point)
    assert best.launch.backward == runs.launch.backward
    assert best.cost.backward_us == runs.cost.backward_us


@SETTINGS
@given(problem=problems(), caps=devices())
def test_the_solver_finds_exactly_the_points_that_meet_every_constraint(
    problem: Problem, caps: HardwareCaps
) -> None:
    for variant in VARIANTS:
        domains = variant.domains(problem, caps)
        every = [dict(zip(domains, values, strict=True)) for values in product(*domains.values())]
        brute = [pt for pt in every if all(c.holds(problem, caps, pt) for c in variant.constraints)]
        assert points(variant, problem, caps) == brute


@settings(max_examples=25, deadline=None)
@given(problem=problems(), caps=devices())
def test_solving_is_deterministic(problem: Problem, caps: HardwareCaps) -> None:
    first = feasible_plans(problem, caps)
    assert feasible_plans(problem, caps) == first
    assert solve(problem, caps).as_dict() == solve(problem, caps).as_dict()
