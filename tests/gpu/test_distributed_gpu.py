"""rnncc under DistributedDataParallel with NCCL on one GPU (world size 1), fused backend,
block tier and grid tier (a cooperative launch beside NCCL's kernels on other streams):
training steps run and the gradients are those of the same model without DDP."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rnncc.testing import rel_err

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
#: (hidden, dtype, variant): float32 runs the block tier's FFMA kernels at 64 units, bfloat16
#: the grid tier at 256 units in one head.
CASES = [(64, torch.float32, "block_ffma"), (256, torch.bfloat16, "grid_mma")]


def _example():
    spec = importlib.util.spec_from_file_location("train_ddp", REPO / "examples" / "train_ddp.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _step(model, example, seed):
    bits, parity = example.batch(16, 32, seed=seed, device="cuda")
    logits = model(bits)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits.float(), parity.float())
    loss.backward()


def _grads(hidden, dtype, ddp: bool, out: str | None = None):
    example = _example()
    torch.manual_seed(0)
    model = example.ParityModel("lstm", hidden, backend="fused").to("cuda", dtype)
    wrapped = torch.nn.parallel.DistributedDataParallel(model) if ddp else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for seed in range(3):  # steps, so that later ones run on updated weights
        optimizer.zero_grad()
        _step(wrapped, example, seed)
        optimizer.step()
    assert model.layers[0].cell.last_backend == "fused"
    grads = {n: p.grad.detach().cpu() for n, p in model.named_parameters()}
    if out is not None:
        torch.save(grads, out)
    return grads


def _worker(rank: int, store: str, hidden: int, dtype: torch.dtype, out: str) -> None:
    import warnings

    # DDP's note that a gradient is laid out unlike its parameter (it then copies each step).
    warnings.filterwarnings("error", message="Grad strides do not match")
    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl",
        init_method=f"file://{store}",
        rank=rank,
        world_size=1,
        device_id=torch.device("cuda", rank),
    )
    try:
        _grads(hidden, dtype, ddp=True, out=out)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("hidden,dtype,tier", CASES, ids=[c[2] for c in CASES])
def test_ddp_with_nccl_matches_the_plain_model(tmp_path, hidden, dtype, tier):
    from rnncc.runtime.api import load

    cell = load(REPO / "examples" / "lstm.rnn")
    assert cell.plan(16, 1, hidden, dtype).variant == tier
    out = tmp_path / "grads.pt"
    mp.spawn(_worker, args=(str(tmp_path / "store"), hidden, dtype, str(out)), nprocs=1)
    got = torch.load(out)
    expected = _grads(hidden, dtype, ddp=False)
    for name, g in expected.items():
        assert rel_err(got[name], g) <= 1e-6, name


@pytest.mark.parametrize("backend", ["stepwise", "fused"])
@pytest.mark.parametrize("heads", [1, 3])
def test_weight_gradients_have_their_parameters_strides(backend, heads):
    """DDP's buckets copy (and warn about) a gradient laid out unlike its parameter: with one
    head, a permuted dR, db or dparams kept an odd stride in the size-1 head dim."""
    import rnncc

    torch.manual_seed(0)
    cell = rnncc.load(REPO / "examples" / "peephole_lstm.rnn")  # R, b and params
    layer = rnncc.RNN(cell, 8, 16 * heads, num_heads=heads, backend=backend).cuda()
    out, last = layer(torch.randn(4, 5, 8, device="cuda"))
    (out.sum() + last.sum()).backward()
    assert cell.last_backend == backend
    for name, p in layer.named_parameters():
        assert p.grad.stride() == p.stride(), name
