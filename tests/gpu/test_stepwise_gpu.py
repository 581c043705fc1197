"""The stepwise variant against the float64 reference (``pytest -m gpu`` on a GPU machine):
every example over a sample of the size matrix that covers every pair of factors, outputs and
workspaces poisoned with NaN; and a package prebuilt by ``rnncc compile --prebuild``."""

from __future__ import annotations

import pytest
import torch
from gpu_reference import (
    DTYPES,
    EXAMPLES,
    INPUTS,
    ROOT,
    case_id,
    check_against_reference,
    load_examples,
    prepare,
)

from rnncc.testing import pairwise, random_inputs, rel_err

pytestmark = pytest.mark.gpu

CASES = pairwise(
    {
        "example": [p.stem for p in EXAMPLES],
        "dtype": list(DTYPES),
        "B": [1, 3, 16],
        "D": [8, 24, 64, 200],
        "NH": [1, 3],
        "T": [1, 7, 300],
    }
)


@pytest.fixture(scope="module")
def cells():
    loaded = load_examples()
    prepare(loaded, [{**c, "D": 8} for c in CASES])  # the stepwise library has no sizes
    return loaded


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_stepwise_matches_float64_reference(cells, case):
    cell = cells[case["example"]]
    plan = check_against_reference(cell, case, "stepwise")
    assert plan.variant == "stepwise"


def test_no_grad_forward_matches(cells):
    cell = cells["lstm"]
    x = {
        k: None if v is None else v.cuda().float()
        for k, v in random_inputs(cell.ir, 4, 9, 2, 16).items()
    }
    with torch.no_grad():
        y, last = cell(*(x[k] for k in INPUTS), backend="stepwise")
        y_ref, last_ref = cell(
            *(None if x[k] is None else x[k].double() for k in INPUTS), backend="reference"
        )
    assert rel_err(y, y_ref) <= 1e-5 and rel_err(last, last_ref) <= 1e-5


def test_prebuilt_package_loads_from_cache(tmp_path):
    """`rnncc compile --prebuild` builds ahead; importing the package then builds nothing."""
    import os
    import subprocess
    import sys

    cache = tmp_path / "cache"
    env = dict(os.environ, RNNCC_CACHE_DIR=str(cache))
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT), env.get("PYTHONPATH", "")])
    compile_cmd = ["-m", "rnncc", "compile", str(ROOT / "examples" / "mgu.rnn")]
    compile_cmd += ["-o", str(tmp_path / "mgu_pkg"), "--prebuild"]
    proc = subprocess.run([sys.executable, *compile_cmd], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    builds = (cache / "builds.log").read_text().splitlines()
    assert len(builds) == 2  # the host loop and the cell's stepwise kernels
    script = (
        "import torch, mgu_pkg\n"
        "layer = mgu_pkg.RNN(8, 16, backend='stepwise').cuda()\n"
        "out, last = layer(torch.randn(2, 5, 8, device='cuda'))\n"
        "out.sum().backward(); torch.cuda.synchronize(); print(mgu_pkg.cell.last_backend)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "stepwise"
    assert (cache / "builds.log").read_text().splitlines() == builds
