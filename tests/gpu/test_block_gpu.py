"""The block-tier fused variants (block_ffma for float32, block_mma for bf16/fp16) against
the float64 reference (``pytest -m gpu`` on a GPU machine): every example over a sample of the
size matrix that covers every pair of factors, and head dims outside it."""

from __future__ import annotations

import pytest
from gpu_reference import (
    DTYPES,
    EXAMPLES,
    case_id,
    check_against_reference,
    load_examples,
    prepare,
)

from rnncc.testing import pairwise

pytestmark = pytest.mark.gpu

FUSED_CASES = pairwise(
    {
        "example": [p.stem for p in EXAMPLES],
        "dtype": list(DTYPES),
        "B": [1, 3, 16, 35],
        "D": [8, 24, 64],
        "NH": [1, 3],
        "T": [1, 7, 300],
    }
)

#: Head dims outside the pairwise sample: tensor-core tiles that are partly padding (40 = 5
#: warps of 8 units, 2.5 k tiles), a head dim that only the tensor-core kernels run, an odd
#: one (the backward's lanes then access their two units one at a time; the forward copies W x
#: 2 bytes at a time), and head dims whose W x rows the forward copies in 8- and 4-byte pieces.
EXTRA_FUSED_CASES = [
    {"example": "lstm", "dtype": "fp16", "B": 9, "D": 40, "NH": 2, "T": 33},
    {"example": "gru", "dtype": "fp16", "B": 11, "D": 20, "NH": 3, "T": 25},
    {"example": "lstm", "dtype": "bf16", "B": 17, "D": 18, "NH": 2, "T": 30},
    {"example": "gru", "dtype": "bf16", "B": 20, "D": 56, "NH": 1, "T": 65},
    {"example": "elman", "dtype": "bf16", "B": 5, "D": 128, "NH": 2, "T": 40},
    {"example": "slstm", "dtype": "bf16", "B": 6, "D": 9, "NH": 2, "T": 20},
]


@pytest.fixture(scope="module")
def cells():
    loaded = load_examples()
    prepare(loaded, FUSED_CASES + EXTRA_FUSED_CASES)
    return loaded


@pytest.mark.parametrize("case", FUSED_CASES + EXTRA_FUSED_CASES, ids=case_id)
def test_block_variants_match_float64_reference(cells, case):
    cell = cells[case["example"]]
    plan = check_against_reference(cell, case, "fused")
    assert plan.variant == ("block_ffma" if case["dtype"] == "fp32" else "block_mma")
