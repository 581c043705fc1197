"""Infeasible problems: TilingError names the binding constraints and the largest head dim."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from rnncc.tiling import Problem, TilingError, caps_for_arch, solve
from rnncc.tiling.model import Model
from rnncc.tiling.solve import diagnose


def _largest(message: str) -> int:
    found = re.search(r"largest head dim that fits with NH=\d+, B=\d+: (\d+)", message)
    assert found, message
    return int(found.group(1))


def test_head_too_large_for_the_whole_chip(lstm: Callable[..., Problem]) -> None:
    caps = caps_for_arch("sm_90")
    with pytest.raises(TilingError) as info:
        solve(lstm(1, 4096), caps)
    message = str(info.value)
    assert "no tiling plan for Gr=4, NH=1, D=4096, B=16, bf16 on NVIDIA H100 SXM" in message
    assert "binding constraints:" in message and "r_fits_on_chip" in message
    assert "134.2 MB per head" in message
    largest = _largest(message)
    assert 2048 <= largest < 4096
    assert solve(lstm(1, largest), caps).tier == "grid"  # the size it names does fit


@pytest.mark.parametrize(("arch", "head_dim"), [("a100", 2048), ("sm_80", 4096), ("l40s", 2048)])
def test_fp32_on_smaller_chips(arch: str, head_dim: int, lstm: Callable[..., Problem]) -> None:
    caps = caps_for_arch(arch)
    with pytest.raises(TilingError, match="r_fits") as info:
        solve(lstm(1, head_dim, dtype="fp32"), caps)
    largest = _largest(str(info.value))
    solve(lstm(1, largest, dtype="fp32"), caps)
    # fp32 storage holds R at twice the bytes: bf16 fits a larger head
    assert solve(lstm(1, largest * 5 // 4), caps).problem.head_dim > largest


def test_no_clusters_before_hopper(lstm: Callable[..., Problem]) -> None:
    model = Model(lstm(1, 768), caps_for_arch("a100"))
    assert diagnose(model, fixed={"tier": "cluster"}) == ["cluster_size_limit"]
    plan = solve(lstm(1, 768), caps_for_arch("a100"))
    assert plan.tier == "grid"
    assert "cluster tier ruled out by cluster_size_limit" in plan.explain()


def test_error_lists_only_hardware_constraints(lstm: Callable[..., Problem]) -> None:
    model = Model(lstm(1, 8192), caps_for_arch("h100"))
    kinds = {c.name: c.kind for c in model.constraints}
    names = diagnose(model)
    assert names and all(kinds[name] == "hardware" for name in names)
