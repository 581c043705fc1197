"""A sparse R (``pytest -m gpu`` on a GPU machine): grid_sparse, whose blocks keep R's
non-zeros on chip, against the float64 reference of the masked dense R, gradients included
(R's only at the kept entries), the variant asserted.

Every example cell with an R at 1 x 2304, B = 4, a random 30 % mask (the planner picks the
sparse kernel there: grid_mma's blocks do not hold a dense R that wide); the GRU at B = 16
(blocks of 8 batch rows, two chunks in two launches), the Elman cell at 2 x 1536 units, B = 3
(a launch per head), the LSTM at 10 % (its backward stages all of dg at once) and at 30.7 %
(h and dg staged in halves), and past what shared memory holds, with part of the entries in
the lanes' registers: the LSTM at 45 %, the GRU at 60 % and B = 16, and the LSTM at 5280 units
and 10 % (2.5 times the dense kernels' limit). The planner runs the GRU at B = 16 and the LSTM at 30.7 % on
grid_stream (R * mask, faster there: tests/variants/test_sparse_variant.py), so these tests
plan without it.
"""

from __future__ import annotations

import pytest
import torch
from gpu_reference import DTYPES, case_id, check_against_reference, load_examples

import rnncc.variants
from rnncc.variants.grid_sparse import REG_ENTRIES

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def without_grid_stream():
    """The kernel under test is grid_sparse: plan these calls without the dense streaming
    variant (R * mask), which the planner prefers for some of these masks."""
    kept = tuple(v for v in rnncc.variants.VARIANTS if v.name != "grid_stream")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rnncc.variants, "VARIANTS", kept)
        yield


WITH_R = ["elman", "gru", "janet", "lstm", "mgu", "peephole_lstm", "slstm"]
LSTM = {"example": "lstm", "dtype": "bf16", "B": 4, "D": 2304, "NH": 1, "T": 5}
CASES = [
    *[{"example": e, "dtype": "bf16", "B": 4, "D": 2304, "NH": 1, "T": 5} for e in WITH_R],
    {"example": "gru", "dtype": "fp16", "B": 16, "D": 2304, "NH": 1, "T": 4},
    {"example": "elman", "dtype": "fp16", "B": 3, "D": 1536, "NH": 2, "T": 6},
    {**LSTM, "density": 0.1},
    {**LSTM, "density": 0.307},
    {**LSTM, "density": 0.45},
    {"example": "gru", "dtype": "fp16", "B": 16, "D": 2304, "NH": 1, "T": 4, "density": 0.6},
    {**LSTM, "D": 5280, "T": 3, "density": 0.1},
]
#: Each case's build (example, B, D, density), where it is not the default: 512 threads, whole
#: operands, no register steps.
DEFAULT_BUILD = {"threads": 512, "fw_split": 1, "bw_split": 1, "fw_reg_steps": 0, "bw_reg_steps": 0}
BUILDS = {
    # the backward stages all of dg at once
    ("lstm", 4, 2304, 0.1): {"bw_gates": 4},
    # the entries fit only beside half of h (and of a gate's dg), staged in halves
    ("lstm", 4, 2304, 0.307): {"fw_split": 2, "bw_split": 2},
    # past what shared memory holds: the lanes' registers hold part of the entries (the
    # backward's chunks, and so its register steps, follow the mask's fullest piece)
    ("lstm", 4, 2304, 0.45): {"threads": 256, "fw_reg_steps": REG_ENTRIES[4, False]},
    ("gru", 16, 2304, 0.6): {"threads": 256, "fw_reg_steps": REG_ENTRIES[8, False]},
    # 2.5 times the dense kernels' limit: h in halves, dg a gate and a half at a time
    ("lstm", 4, 5280, 0.1): {
        "threads": 256,
        "fw_reg_steps": REG_ENTRIES[4, False] // 2,
        "bw_reg_steps": REG_ENTRIES[4, True] // 8,
        "fw_split": 2,
        "bw_split": 2,
    },
}
DENSITY = 0.3


def random_mask(cell, case: dict) -> torch.Tensor:
    shape = cell.shapes(case["B"], case["T"], case["NH"], case["D"])["R"]
    g = torch.Generator(device="cuda").manual_seed(7)
    return torch.rand(shape, generator=g, device="cuda") < case.get("density", DENSITY)


@pytest.fixture(scope="module")
def cells():
    loaded = load_examples()
    from concurrent.futures import ThreadPoolExecutor

    def prepare(c: dict) -> None:
        cell = loaded[c["example"]]
        cell.prepare(
            "cuda",
            head_dim=c["D"],
            dtype=DTYPES[c["dtype"]],
            batch=c["B"],
            heads=c["NH"],
            mask=random_mask(cell, c),
        )

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(prepare, CASES))
    return loaded


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_sparse_blocks_match_float64_reference(cells, case):
    cell = cells[case["example"]]
    mask = random_mask(cell, case)
    plan = check_against_reference(cell, case, "fused", mask=mask)
    assert plan.variant == "grid_sparse"
    assert plan.problem.density < case.get("density", DENSITY) + 0.05
    build = BUILDS.get((case["example"], case["B"], case["D"], case.get("density")), {})
    want = {**DEFAULT_BUILD, **build}
    if want["threads"] == 256 and "bw_reg_steps" not in build:
        del want["bw_reg_steps"]
        assert plan.build["bw_reg_steps"] > 0
    assert {k: plan.build[k] for k in want} == want
