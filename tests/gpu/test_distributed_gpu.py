"""rnncc under DistributedDataParallel with NCCL, fused backend, block tier and grid tier (a
cooperative launch beside NCCL's kernels on other streams). World size 1: training steps run
and the gradients are those of the same model without DDP. Two GPUs (skipped with fewer):
the ranks' averaged gradients are one process's on the concatenated batch, and the grid
tier trains beside NCCL's all-reduces of earlier layers without either waiting forever."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rnncc.testing import TOLERANCES, rel_err

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


def _join_nccl(rank: int, world: int, store: str) -> None:
    """This process as rank ``rank`` of ``world`` on GPU ``rank``, NCCL, met through a file."""
    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world,
        device_id=torch.device("cuda", rank),
    )


def _worker(rank: int, store: str, hidden: int, dtype: torch.dtype, out: str) -> None:
    import warnings

    # DDP's note that a gradient is laid out unlike its parameter (it then copies each step).
    warnings.filterwarnings("error", message="Grad strides do not match")
    _join_nccl(rank, 1, store)
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


def _stack_grads(bucket_mb: float | None, out: str | None = None, rank: int = 0, world: int = 1):
    """Three SGD steps of a 3-layer bidirectional LSTM (grid tier, bf16), whose upper layers
    make their weight gradients on a second stream outside a process group; under DDP with
    buckets of ``bucket_mb`` (None: no DDP), on this rank's share of each batch of 16 rows."""
    import rnncc

    torch.manual_seed(0)
    model = rnncc.RNN(
        rnncc.load(REPO / "examples" / "lstm.rnn"),
        8,
        256,
        num_layers=3,
        bidirectional=True,
        backend="fused",
    ).to("cuda", torch.bfloat16)
    ddp = torch.nn.parallel.DistributedDataParallel
    wrapped = model if bucket_mb is None else ddp(model, bucket_cap_mb=bucket_mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        optimizer.zero_grad()
        x = torch.randn(16, 32, 8, generator=g).chunk(world)[rank].to("cuda", torch.bfloat16)
        wrapped(x)[0].float().square().mean().backward()
        optimizer.step()
    assert model.cell.last_backend == "fused"
    grads = {n: p.grad.detach().cpu() for n, p in model.named_parameters()}
    if out is not None:
        torch.save(grads, out)
    return grads


def _stack_worker(rank: int, store: str, bucket_mb: float, out: str, world: int = 1) -> None:
    import warnings

    from rnncc.runtime import module

    # DDP holds each parameter's accumulation node on this stream: a gradient made on the
    # second stream would be accumulated here, torch saying so each backward.
    warnings.filterwarnings("error", message="The AccumulateGrad node's stream")
    module.project_beside = module.recurrent_beside = None  # called: a TypeError
    _join_nccl(rank, world, store)
    try:
        _stack_grads(bucket_mb, out if world == 1 else f"{out}.{rank}", rank, world)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("bucket_mb", [0.05, 25.0], ids=["a-bucket-a-weight", "one-bucket"])
def test_ddp_of_a_stack_keeps_one_stream(tmp_path, bucket_mb):
    """World size 1: a stack whose upper layers use a second stream outside a process group
    keeps one under DDP (no stream-mismatch warning), with the bits of the plain model on two
    streams."""
    out = tmp_path / "grads.pt"
    mp.spawn(_stack_worker, args=(str(tmp_path / "store"), bucket_mb, str(out)), nprocs=1)
    got = torch.load(out)
    for name, g in _stack_grads(None).items():
        assert torch.equal(got[name], g), name


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


two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
#: The global batch of the two-rank tests, split evenly between the ranks.
GLOBAL_BATCH, LENGTH = 32, 32


def _global_steps(model, wrapped, example, steps: int, rank: int, world: int):
    """``steps`` SGD steps on the global batches of seeds 0, 1, ...: this rank's share of each,
    its loss the mean over that share (DDP averages over the ranks: the global mean)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for seed in range(steps):
        bits, parity = example.batch(GLOBAL_BATCH, LENGTH, seed=seed, device="cuda")
        optimizer.zero_grad()
        logits = wrapped(bits.chunk(world)[rank])
        target = parity.chunk(world)[rank].float()
        torch.nn.functional.binary_cross_entropy_with_logits(logits.float(), target).backward()
        optimizer.step()
    return {n: p.grad.detach().cpu() for n, p in model.named_parameters()}


def _two_rank_worker(
    rank: int, store: str, backend: str, hidden: int, dtype, steps: int, bucket_mb: float, out: str
) -> None:
    _join_nccl(rank, 2, store)
    try:
        example = _example()
        torch.manual_seed(0)
        model = example.ParityModel("lstm", hidden, backend=backend).to("cuda", dtype)
        # Small buckets: a layer's all-reduce runs while the layer below computes its backward.
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_mb)
        grads = _global_steps(model, ddp, example, steps, rank, 2)
        assert model.layers[0].cell.last_backend == backend
        torch.save(grads, f"{out}.{rank}")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _spawn_two_ranks(args: tuple, timeout_s: float, worker=_two_rank_worker) -> None:
    """Run ``worker`` (rank, *args) on GPUs 0 and 1; fail (and end them) after ``timeout_s``."""
    context = mp.spawn(worker, args=args, nprocs=2, join=False)
    deadline = time.monotonic() + timeout_s
    while not context.join(timeout=5):
        if time.monotonic() > deadline:
            for p in context.processes:
                p.kill()
            pytest.fail(f"two DDP ranks still running after {timeout_s:.0f} s: a hang")


@two_gpus
@pytest.mark.parametrize(
    "backend,hidden,dtype",
    [
        ("reference", 16, torch.float64),
        ("fused", 64, torch.float32),  # block tier
        ("fused", 256, torch.bfloat16),  # grid tier
    ],
    ids=["reference-fp64", "block_ffma-fp32", "grid_mma-bf16"],
)
def test_two_gpus_average_to_one_process_on_the_whole_batch(tmp_path, backend, hidden, dtype):
    """float64 on the reference backend to 1e-12, as the CPU (gloo) test; the fused tiers to
    their dtype's tolerance (the batch is split, so the kernels sum dR in another order)."""
    out = str(tmp_path / "grads")
    _spawn_two_ranks((str(tmp_path / "store"), backend, hidden, dtype, 3, 0.05, out), 300)
    got = [torch.load(f"{out}.{rank}") for rank in range(2)]
    example = _example()
    torch.manual_seed(0)
    model = example.ParityModel("lstm", hidden, backend=backend).to("cuda", dtype)
    expected = _global_steps(model, model, example, 3, 0, 1)
    tol = 1e-12 if dtype == torch.float64 else TOLERANCES[dtype]
    for name, g in expected.items():
        assert torch.equal(got[0][name], got[1][name]), f"{name}: the ranks differ"
        assert rel_err(got[0][name], g) <= tol, name


@two_gpus
def test_two_gpus_grid_tier_filling_the_chip_beside_nccl(tmp_path):
    """At 2048 units the grid tier's cooperative kernels hold 128 of an H100's 132 SMs, and
    tiny buckets put an all-reduce beside nearly every backward kernel: 30 steps finish."""
    from rnncc.runtime.api import load

    cell = load(REPO / "examples" / "lstm.rnn")
    plan = cell.plan(GLOBAL_BATCH // 2, 1, 2048, torch.bfloat16)
    assert plan.variant == "grid_mma"
    args = (str(tmp_path / "store"), "fused", 2048, torch.bfloat16, 30, 0.01, str(tmp_path / "g"))
    _spawn_two_ranks(args, 400)
    for rank in range(2):
        grads = torch.load(tmp_path / f"g.{rank}")
        assert all(torch.isfinite(g).all() for g in grads.values())


@two_gpus
def test_two_gpus_train_a_stack_on_one_stream(tmp_path):
    """Two ranks, a bucket a weight, the stack on one stream under DDP. The ranks agree bit for
    bit, and their average is one process's gradient on the whole batch (two streams; to
    bf16's tolerance: the kernels sum dR in another order)."""
    out = str(tmp_path / "grads")
    _spawn_two_ranks((str(tmp_path / "store"), 0.05, out, 2), 300, _stack_worker)
    got = [torch.load(f"{out}.{rank}") for rank in range(2)]
    for name, g in _stack_grads(None).items():
        assert torch.equal(got[0][name], got[1][name]), f"{name}: the ranks differ"
        assert rel_err(got[0][name], g) <= TOLERANCES[torch.bfloat16], name
