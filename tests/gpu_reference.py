"""Shared by the GPU tests: the examples, and one call of a backend checked against the float64
reference (outputs, last states and all five gradients, outputs and workspaces poisoned)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

import rnncc
from rnncc.config import override
from rnncc.testing import TOLERANCES, random_inputs, rel_err

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.rnn"))
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
INPUTS = ("Wx", "R", "b", "states", "params")
#: The inputs' seed. (The sLSTM's grid-tier case is sensitive to it: its stabiliser's max can
#: flip across near-ties in bf16; see tests/gpu/test_grid_gpu.py.)
SEED = 49


def load_examples() -> dict[str, rnncc.CompiledCell]:
    return {p.stem: rnncc.load(p) for p in EXAMPLES}


def prepare(cells: dict, cases: list[dict]) -> None:
    """Build every library the cases run, in parallel (one build step, not one per test); a
    case with ``"timeline": True`` runs with lengths or reversed."""
    jobs = {
        (c["example"], c["D"], c["dtype"], c["B"], c["NH"], c.get("timeline", False)) for c in cases
    }
    with override(poison=True), ThreadPoolExecutor(max_workers=16) as pool:
        list(
            pool.map(
                lambda j: cells[j[0]].prepare(
                    "cuda", head_dim=j[1], dtype=DTYPES[j[2]], batch=j[3], heads=j[4], timeline=j[5]
                ),
                sorted(jobs),
            )
        )


def case_id(c: dict) -> str:
    return "-".join(f"{k}{v}" if k != "example" else v for k, v in c.items())


def run(cell, x, backend, cot, **kw):
    args = {k: None if v is None else v.clone().requires_grad_() for k, v in x.items()}
    y, last = cell(*(args[k] for k in INPUTS), backend=backend, **kw)
    loss = (y.double() * cot["y"]).sum() + (last.double() * cot["last"]).sum()
    names = [k for k in INPUTS if args[k] is not None]
    grads = torch.autograd.grad(loss, [args[k] for k in names])
    return y, last, dict(zip(names, grads, strict=True))


def errors_against_reference(cell, case: dict, backend: str, seed: int = SEED, **kw):
    """Run ``case`` on ``backend`` and on the reference in float64 (from the same rounded
    inputs; ``kw``: the call's ``lengths=``, ``reverse=``): the plan the backend call ran and
    the relative errors of the outputs, last states and gradients, by name."""
    dtype = DTYPES[case["dtype"]]
    x64 = random_inputs(cell.ir, case["B"], case["T"], case["NH"], case["D"], seed=seed)
    x = {k: None if v is None else v.to("cuda", dtype) for k, v in x64.items()}
    ref_in = {k: None if v is None else v.double() for k, v in x.items()}  # the rounded inputs
    shapes = cell.shapes(case["B"], case["T"], case["NH"], case["D"])
    g = torch.Generator(device="cuda").manual_seed(1)
    cot = {
        k: torch.randn(shapes[k], generator=g, device="cuda", dtype=torch.float64)
        for k in ("y", "last")
    }
    with override(poison=True):
        y, last, grads = run(cell, x, backend, cot, **kw)
    assert cell.last_backend == backend
    plan = cell.last_plan
    y_ref, last_ref, grads_ref = run(cell, ref_in, "reference", cot, **kw)
    assert y.dtype == dtype and last.dtype == dtype
    errors = {"y": rel_err(y, y_ref), "last": rel_err(last, last_ref)}
    errors.update({f"d{k}": rel_err(grads[k], grads_ref[k]) for k in grads_ref})
    return plan, errors


def check_against_reference(cell, case: dict, backend: str, seed: int = SEED, **kw):
    """``errors_against_reference``, every error within the dtype's tolerance; returns the
    plan the backend call ran."""
    plan, errors = errors_against_reference(cell, case, backend, seed, **kw)
    tol = TOLERANCES[DTYPES[case["dtype"]]]
    bad = {k: v for k, v in errors.items() if not v <= tol}
    assert not bad, f"relative errors above {tol}: {bad}"
    return plan
