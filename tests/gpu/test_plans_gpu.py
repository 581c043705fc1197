"""The plan is what runs (``pytest -m gpu``): for every problem of the plan table
(tests/golden/plans-h100.txt, which the CPU suite checks against ``rnncc plan``), a call on the
GPU launches exactly the planned variant, parameters and launch shape. The library refuses a
launch whose numbers differ from the ones it was built with, so a call that runs and records
the plan ran that plan."""

from __future__ import annotations

import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from gpu_reference import DTYPES, INPUTS
from plan_table import plan_rows

import rnncc
from rnncc.testing import random_inputs

pytestmark = pytest.mark.gpu

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "plans-h100.txt"
ROWS = list(plan_rows())


def _golden() -> dict[str, str]:
    lines = GOLDEN.read_text().splitlines()
    return dict(line.split(": ", 1) for line in lines)


def _key(path: Path, nh: int, d: int, dtype: str, b: int) -> str:
    return f"{path.stem} {nh}x{d} {dtype} {b}"


@pytest.fixture(scope="module")
def cells():
    loaded = {path: rnncc.load(path) for path in {row[0] for row in ROWS}}

    def prepare(row):
        path, nh, d, dtype, b = row
        loaded[path].prepare("cuda", head_dim=d, dtype=DTYPES[dtype], batch=b, heads=nh)

    with warnings.catch_warnings(), ThreadPoolExecutor(max_workers=16) as pool:
        warnings.simplefilter("ignore")
        list(pool.map(prepare, ROWS))
    return loaded


def _on_the_table_gpu() -> bool:
    props = torch.cuda.get_device_properties(0)
    return "H100" in props.name and "PCIe" not in props.name and props.multi_processor_count == 132


@pytest.mark.parametrize("row", ROWS, ids=lambda r: _key(*r).replace(" ", "-"))
def test_a_call_launches_the_planned_kernel(cells, row):
    path, nh, d, dtype, b = row
    cell = cells[path]
    x = random_inputs(cell.ir, b, 2, nh, d, seed=0)
    args = [None if x[k] is None else x[k].to("cuda", DTYPES[dtype]) for k in INPUTS]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the stepwise rows warn, as they should
        y, _ = cell(*args)
    torch.cuda.synchronize()
    assert torch.isfinite(y).all()
    launched = cell.last_plan
    assert launched is cell.plan(b, nh, d, DTYPES[dtype], "cuda:0")
    if _on_the_table_gpu():  # the table is planned for an H100 SXM's caps
        assert launched.summary() == _golden()[_key(path, nh, d, dtype, b)]
