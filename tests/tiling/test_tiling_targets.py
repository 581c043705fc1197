"""The H100 sanity targets of the tiling issue (LSTM, bf16, B = 16) and explain()."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from rnncc.tiling import HardwareCaps, Problem, TilingPlan, feasible_plans, solve


def _all_of_r_on_chip(plan: TilingPlan) -> bool:
    p = plan.problem
    unit = p.gates_r * plan.heads_per_unit * plan.head_dim_padded**2 * p.dtype_bytes
    on_chip = plan.r_reg_bytes_per_block + plan.r_smem_bytes_per_block
    return on_chip == plan.r_bytes_per_block and on_chip * plan.blocks_per_unit == unit


def test_12x64_heads_are_block_units_with_block_barriers(
    lstm: Callable[..., Problem], h100: HardwareCaps
) -> None:
    plan = solve(lstm(12, 64), h100)
    assert plan.tier == "block"
    assert plan.heads_per_unit == 1 and plan.blocks_per_unit == 1
    assert plan.barrier == "syncthreads"
    assert plan.r_bytes_per_block == 4 * 64 * 64 * 2  # 32 KiB: one head's R per block
    assert _all_of_r_on_chip(plan)
    assert plan.n_units >= 12 and plan.waves == 1


@pytest.mark.parametrize("head_dim", [64, 128, 256, 512, 768, 1024, 1536, 2048])
def test_one_head_keeps_all_of_r_on_chip_up_to_2048(
    head_dim: int, lstm: Callable[..., Problem], h100: HardwareCaps
) -> None:
    plan = solve(lstm(1, head_dim), h100)
    assert _all_of_r_on_chip(plan)
    assert plan.smem_bytes_per_block <= h100.smem_per_block_optin
    assert plan.regs_per_thread <= h100.max_regs_per_thread


def test_768_needs_a_16_block_cluster_or_the_grid(
    lstm: Callable[..., Problem], h100: HardwareCaps
) -> None:
    plans = feasible_plans(lstm(1, 768), h100)
    assert plans[0].tier != "block"
    assert all(p.tier != "block" for p in plans)  # 4.7 MB of R does not fit one SM
    clusters = [p for p in plans if p.tier == "cluster"]
    # ≥ 10 SMs' registers and shared memory hold R; of the cluster sizes that divide 768,
    # 12 and 16 do, and 16 is the non-portable opt-in size.
    assert min(p.blocks_per_unit for p in clusters) >= 10
    assert any(p.blocks_per_unit == 16 and p.cluster_nonportable for p in clusters)


def test_1024_needs_the_grid(lstm: Callable[..., Problem], h100: HardwareCaps) -> None:
    plans = feasible_plans(lstm(1, 1024), h100)
    assert {p.tier for p in plans} == {"grid"}  # 8.4 MB: beyond a 16-block cluster
    assert plans[0].barrier == "grid"
    assert plans[0].blocks_per_unit * plans[0].n_units <= h100.sm_count


def test_units_never_need_more_than_the_chip_at_once(
    lstm: Callable[..., Problem], h100: HardwareCaps
) -> None:
    plan = solve(lstm(1, 1024, batch=256), h100)
    assert plan.tier == "grid"
    assert plan.blocks_per_unit <= h100.sm_count
    assert plan.r_replicated == (plan.n_chunks > 1)


def test_padding_and_masking(lstm: Callable[..., Problem], h100: HardwareCaps) -> None:
    plan = solve(lstm(1, 24, batch=3), h100)
    assert plan.head_dim_padded == 32
    assert plan.batch_chunk_padded == 8 and plan.masked_batch_columns == 5
    plan = solve(lstm(4, 200, batch=3), h100)
    assert plan.head_dim_padded >= 200 and plan.head_dim_padded % 16 == 0
    assert plan.head_dim_padded % plan.blocks_per_unit == 0


def test_elementwise_cell_has_no_product_and_no_barrier(h100: HardwareCaps) -> None:
    problem = Problem(gates_r=0, heads=12, head_dim=64, batch=16, mufu_ops=2, alu_ops=3)
    plan = solve(problem, h100)
    assert plan.mma == "none" and plan.barrier == "none" and plan.tier == "block"
    assert plan.r_bytes_per_block == 0
    assert "elementwise" in plan.explain()


def test_fp32_uses_an_fp32_accurate_product(
    lstm: Callable[..., Problem], h100: HardwareCaps
) -> None:
    fp32 = solve(lstm(12, 64, dtype="fp32"), h100)
    bf16 = solve(lstm(12, 64), h100)
    assert fp32.mma == "tf32x3" and fp32.mma_tile == (16, 8, 8)
    assert fp32.predicted_us_per_step > bf16.predicted_us_per_step


def test_explain_names_tier_binding_constraints_and_cost(
    lstm: Callable[..., Problem], h100: HardwareCaps
) -> None:
    text = solve(lstm(1, 1024), h100).explain()
    assert "tier        grid" in text
    assert "block tier ruled out by" in text and "r_fits_on_chip" in text
    assert "cluster tier ruled out by" in text
    assert "binding" in text and "µs/step forward" in text and "backward" in text
    text = solve(lstm(1, 2048), h100).explain()
    assert "registers_per_thread" in text.split("binding")[1].splitlines()[0]


def test_as_dict_is_json(lstm: Callable[..., Problem], h100: HardwareCaps) -> None:
    plan = solve(lstm(3, 256), h100)
    data = json.loads(json.dumps(plan.as_dict()))
    assert data["tier"] == plan.tier
    assert data["problem"]["head_dim"] == 256
    assert data["caps"]["sm_count"] == 132
    assert data["cost"]["forward_us"] == plan.predicted_us_per_step
    assert isinstance(data["binding"], list)


def test_h100_pcie_and_sxm_plans_differ_by_sm_count(lstm: Callable[..., Problem]) -> None:
    from rnncc.tiling import caps_for_arch

    sxm = solve(lstm(12, 64, batch=256), caps_for_arch("h100"))
    pcie = solve(lstm(12, 64, batch=256), caps_for_arch("h100-pcie"))
    assert sxm.caps.sm_count == 132 and pcie.caps.sm_count == 114
    assert pcie.predicted_us_per_step >= sxm.predicted_us_per_step
