"""Infeasible problems: TilingError names, per variant, the constraints that rule it out."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rnncc.tiling import HardwareCaps, Problem, TilingError, solve
from rnncc.variants import BY_NAME, VARIANTS

FUSED = [v for v in VARIANTS if v.host == "fused"]


def _ruled_out(message: str) -> dict[str, list[str]]:
    """variant → the constraint names listed under it in a TilingError's message."""
    found: dict[str, list[str]] = {}
    for line in message.splitlines()[1:]:
        if line.startswith("  ") and line.endswith(": ruled out by"):
            current = found.setdefault(line.strip().split(":")[0], [])
        elif line.startswith("    "):
            current.append(line.strip().split(":")[0])
    return found


def test_8192_runs_on_no_fused_variant(problem: Callable[..., Problem], h100: HardwareCaps) -> None:
    with pytest.raises(TilingError) as info:
        solve(problem("lstm", 1, 8192), h100, FUSED)
    message = str(info.value)
    assert message.startswith(
        "no kernel variant runs Gr=4, NH=1, D=8192, B=16, bf16 on NVIDIA H100 SXM (132 SMs)\n"
    )
    # bf16 is not block_ffma's dtype: it is not a candidate and not listed.
    assert _ruled_out(message) == {
        # 256 warps, 4 × 128 × 2 fragment registers, 4 steps × 8 rows of W x at 16 KiB: every
        # limit of one block, on the problem alone, so all of them.
        # A sparse R only (a mask), and even then 8192 units' strips pass shared memory.
        "grid_sparse": ["sparse_r", "entries_fit_on_chip"],
        "block_mma": [
            "block_warps",
            "r_fragments_fit_registers",
            "forward_fits_shared_memory",
            "backward_fits_static_shared_memory",
            "backward_fits_shared_memory",
        ],
        # Narrow blocks stop at 1024 units; wide ones split R between registers and shared
        # memory, but 8192 / 16 = 512 blocks hold 1 MiB of R each: the nearest misses are
        # wide blocks four per SM, whose shared memory is short.
        "grid_mma": ["partial_sums_fit_shared_memory"],
        # Streaming blocks, 32 units each: 256 of them, one per SM on 132.
        "grid_stream": ["head_blocks_co_resident"],
    }


def test_wide_blocks_are_ruled_out_by_their_own_constraints(
    problem: Callable[..., Problem], h100: HardwareCaps
) -> None:
    constraints = BY_NAME["grid_mma"].constraints

    def broken(p: Problem, uw: int, bps: int = 1) -> set[str]:
        point = {"n_tiles": 1, "unit_tiles": uw, "blocks_per_sm": bps}
        return {c.name for c in constraints if not c.holds(p, h100, point)}

    # 1024: narrow blocks; wide ones stop at 768 units and split R only past 1024.
    assert broken(problem("lstm", 1, 1024), 2) == {"wide_blocks_fit_registers", "product_warps"}
    assert broken(problem("lstm", 1, 1024), 1) == set()
    # 2048: split wide blocks, 128 of them; narrow ones stop at 1024 units.
    assert broken(problem("lstm", 1, 2048), 2) == set()
    assert broken(problem("lstm", 1, 2048), 1) == {
        "narrow_blocks_fit_registers",
        "head_blocks_co_resident",
    }
    p4096 = problem("lstm", 1, 4096)
    assert broken(p4096, 2) == {"partial_sums_fit_shared_memory", "head_blocks_co_resident"}
    assert broken(p4096, 2, 2) == {"partial_sums_fit_shared_memory"}


def test_fp32_past_1024_has_no_fused_variant(
    problem: Callable[..., Problem], h100: HardwareCaps
) -> None:
    assert solve(problem("lstm", 1, 64, dtype="fp32"), h100, FUSED).variant == "block_ffma"
    # Past a thread's row of 64 floats, the grid tier's narrow blocks (3xTF32) up to 1024.
    assert solve(problem("lstm", 1, 65, dtype="fp32"), h100, FUSED).variant == "grid_mma"
    assert solve(problem("lstm", 1, 1024, dtype="fp32"), h100, FUSED).variant == "grid_mma"
    with pytest.raises(TilingError) as info:
        solve(problem("lstm", 1, 1025, dtype="fp32"), h100, FUSED)
    message = str(info.value)
    assert _ruled_out(message)["grid_mma"] == ["narrow_blocks_fit_registers"]
    assert "head dim ≤ 64" in message
    # and why the other tensor-core variants are not among them
    assert message.endswith(
        "\n  block_mma, grid_stream, grid_sparse: store fp16 and bf16 only, not fp32"
    )


def test_no_variant_stores_the_dtype(problem: Callable[..., Problem], h100: HardwareCaps) -> None:
    sixteen_bit = [BY_NAME["block_mma"], BY_NAME["grid_stream"]]
    with pytest.raises(TilingError, match="none of block_mma, grid_stream stores fp32"):
        solve(problem("lstm", 12, 64, dtype="fp32"), h100, sixteen_bit)


def test_stepwise_runs_what_no_fused_variant_does(
    problem: Callable[..., Problem], h100: HardwareCaps
) -> None:
    plan = solve(problem("lstm", 1, 8192), h100)
    assert plan.variant == "stepwise" and not plan.fused
    text = plan.explain()
    assert "  other       grid_mma: ruled out by partial_sums_fit_shared_memory" in text
    assert "  other       grid_stream: ruled out by head_blocks_co_resident" in text
    assert "  other       block_mma: ruled out by block_warps, r_fragments_fit_registers" in text
    assert text.endswith("\n  other       block_ffma: store fp32 only, not bf16")
    fp32 = solve(problem("lstm", 1, 1536, dtype="fp32"), h100).explain().splitlines()
    assert fp32[-1] == (
        "  other       block_mma, grid_stream, grid_sparse: store fp16 and bf16 only, not fp32"
    )
