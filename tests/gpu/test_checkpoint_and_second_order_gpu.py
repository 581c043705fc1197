"""The CUDA backends under a second differentiation (a clear error, never a silently missing
term) and after pickling (the copy rebuilds its kernels' ops and gives the same results)."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import pytest
import torch

import rnncc
from rnncc.testing import random_inputs

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
INPUTS = ("Wx", "R", "b", "states", "params")


def _inputs(cell, dtype=torch.float32):
    x = random_inputs(cell.ir, 3, 6, 2, 16, dtype=dtype, device="cuda", seed=1)
    return {k: None if v is None else v.requires_grad_() for k, v in x.items()}


@pytest.mark.parametrize("backend", ["stepwise", "fused"])
def test_a_gradient_penalty_raises_at_the_second_backward(backend):
    cell = rnncc.load(ROOT / "examples" / "lstm.rnn")
    x = _inputs(cell)
    args = [x[k] for k in INPUTS]
    y, _ = cell(*args, backend=backend)
    plain = torch.autograd.grad(y.square().sum(), x["Wx"])[0]
    y, _ = cell(*args, backend=backend)
    (g,) = torch.autograd.grad(y.square().sum(), x["Wx"], create_graph=True)
    assert torch.equal(g, plain)  # first order is unchanged by create_graph
    with pytest.raises(RuntimeError, match=f"the {backend} backend's backward is not differ"):
        (y.sum() + g.square().sum()).backward()


@pytest.mark.parametrize("backend", ["stepwise", "fused"])
def test_a_pickled_cell_runs_its_kernels_again(backend):
    cell = rnncc.load(ROOT / "examples" / "gru.rnn")
    x = _inputs(cell, torch.bfloat16)
    args = [x[k] for k in INPUTS]
    y, last = cell(*args, backend=backend)
    for clone in (pickle.loads(pickle.dumps(cell)), copy.deepcopy(cell)):
        y2, last2 = clone(*args, backend=backend)
        assert clone.last_backend == backend
        assert torch.equal(y, y2) and torch.equal(last, last2)
