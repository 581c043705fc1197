"""A sparse R (``pytest -m gpu`` on a GPU machine): grid_sparse, whose blocks keep R's
non-zeros on chip, against the float64 reference of the masked dense R, gradients included
(R's only at the kept entries), the variant asserted.

Every example cell with an R at 1 x 2304, B = 4, a random 30 % mask (the planner picks the
sparse kernel there: grid_mma's blocks do not hold a dense R that wide); the GRU at B = 16
(blocks of 8 batch rows, two chunks in two launches), the Elman cell at 2 x 1536 units, B = 3
(a launch per head), the LSTM at 10 % (its backward stages all of dg at once) and at 32.5 %
(h and dg staged in halves). The planner runs the GRU at B = 16 and the LSTM at 32.5 % on
grid_stream (R * mask, faster there: tests/variants/test_sparse_variant.py), so these tests
plan without it.
"""

from __future__ import annotations

import pytest
import torch
from gpu_reference import DTYPES, case_id, check_against_reference, load_examples

import rnncc.variants
from rnncc.runtime.sparsity import strip_density
from rnncc.variants.grid_sparse import block_units

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
CASES = [
    *[{"example": e, "dtype": "bf16", "B": 4, "D": 2304, "NH": 1, "T": 5} for e in WITH_R],
    {"example": "gru", "dtype": "fp16", "B": 16, "D": 2304, "NH": 1, "T": 4},
    {"example": "elman", "dtype": "fp16", "B": 3, "D": 1536, "NH": 2, "T": 6},
    # 10 %: the backward stages all of dg at once (bw_gates = 4)
    {"example": "lstm", "dtype": "bf16", "B": 4, "D": 2304, "NH": 1, "T": 5, "density": 0.1},
    # 32.5 %: the entries fit only beside half of h (and of a gate's dg), staged in halves
    {"example": "lstm", "dtype": "bf16", "B": 4, "D": 2304, "NH": 1, "T": 5, "density": 0.325},
]
DENSITY = 0.3


def random_mask(cell, case: dict) -> torch.Tensor:
    shape = cell.shapes(case["B"], case["T"], case["NH"], case["D"])["R"]
    g = torch.Generator(device="cuda").manual_seed(7)
    return torch.rand(shape, generator=g, device="cuda") < case.get("density", DENSITY)


@pytest.fixture(scope="module")
def cells():
    loaded = load_examples()
    from concurrent.futures import ThreadPoolExecutor

    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def prepare(c: dict) -> None:
        cell = loaded[c["example"]]
        density = strip_density(random_mask(cell, c), block_units(c["D"], sms))
        cell.prepare(
            "cuda",
            head_dim=c["D"],
            dtype=DTYPES[c["dtype"]],
            batch=c["B"],
            heads=c["NH"],
            density=density,
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
    assert plan.build["bw_gates"] in (1, plan.problem.gates_r)
    if case.get("density") == 0.1:
        assert plan.build["bw_gates"] == 4
    halves = 2 if case.get("density") == 0.325 else 1
    assert (plan.build["fw_split"], plan.build["bw_split"]) == (halves, halves)
