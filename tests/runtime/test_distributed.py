"""rnncc models under torch.distributed on the CPU (gloo, the reference backend, float64):
DistributedDataParallel and FSDP2's fully_shard over two processes give the gradients of one
process on the concatenated batch; examples/train_ddp.py runs under torchrun."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rnncc.testing import rel_err

REPO = Path(__file__).resolve().parents[2]
WORLD = 2


def _example():
    spec = importlib.util.spec_from_file_location("train_ddp", REPO / "examples" / "train_ddp.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _model_and_batch(cell: str):
    example = _example()
    torch.manual_seed(0)
    model = example.ParityModel(cell, hidden=6, backend="reference").double()
    bits, parity = example.batch(2 * WORLD, 5, seed=3, device="cpu")
    return model, bits, parity.double()


def _loss(model, bits, parity):
    return torch.nn.functional.binary_cross_entropy_with_logits(model(bits), parity)


def _worker(rank: int, store: str, wrap: str, cell: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        model, bits, parity = _model_and_batch(cell)
        if wrap == "ddp":
            wrapped = torch.nn.parallel.DistributedDataParallel(model)
        else:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh("cpu", (WORLD,))
            for layer in model.layers:
                fully_shard(layer, mesh=mesh)
            wrapped = fully_shard(model, mesh=mesh)
        with warnings.catch_warnings():  # FSDP2's note that a module returned a view
            warnings.simplefilter("ignore", UserWarning)
            # Each rank's loss is the mean over its half: averaged over the ranks, the mean
            # over the global batch.
            _loss(wrapped, bits.chunk(WORLD)[rank], parity.chunk(WORLD)[rank]).backward()
        grads = {}
        for name, p in model.named_parameters():
            grads[name] = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        if rank == 0:
            torch.save(grads, out)
        dist.barrier()  # no rank leaves while another still talks to it
    finally:
        dist.destroy_process_group()
    # Leave without the interpreter's teardown: now and then (about 1 run in 20 here) gloo's
    # threads, destroyed there, abort the process after the work is done.
    os._exit(0)


@pytest.mark.slow
@pytest.mark.parametrize("wrap", ["ddp", "fsdp2"])
@pytest.mark.parametrize("cell", ["lstm", "slstm"])
def test_data_parallel_gradients_equal_one_process_on_the_whole_batch(tmp_path, wrap, cell):
    out = tmp_path / "grads.pt"
    mp.spawn(_worker, args=(str(tmp_path / "store"), wrap, cell, str(out)), nprocs=WORLD)
    got = torch.load(out)
    model, bits, parity = _model_and_batch(cell)
    _loss(model, bits, parity).backward()
    assert set(got) == {name for name, _ in model.named_parameters()}
    for name, p in model.named_parameters():
        assert rel_err(got[name], p.grad) <= 1e-12, name


@pytest.mark.slow
def test_train_ddp_example_runs_under_torchrun(tmp_path):
    """Two CPU processes (gloo) train a few steps of the example; it reports and exits 0."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={WORLD}"]
    cmd += [
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=localhost:0",
        str(REPO / "examples" / "train_ddp.py"),
    ]
    cmd += ["--length", "8", "--hidden", "8", "--batch", "4", "--steps", "2", "--eval-every", "1"]
    cmd += ["--target", "0"]
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{WORLD} process(es) on cpu, lstm, 8 bits, batch 4" in proc.stdout
    assert "reached 0% held-out accuracy" in proc.stdout and "backend reference" in proc.stdout


@pytest.mark.parametrize("flag", ["--steps", "--eval-every", "--length", "--batch", "--hidden"])
@pytest.mark.parametrize("value", ["0", "-2"])
def test_train_ddp_refuses_non_positive_counts(capsys, flag, value):
    with pytest.raises(SystemExit) as exit_:
        _example().main([flag, value])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert err.splitlines()[-1].endswith(
        f": error: argument {flag}: must be a positive integer, got '{value}'"
    )


def test_train_ddp_evaluates_at_the_last_step(capsys, monkeypatch):
    """Fewer steps than --eval-every: the run still ends with an evaluation."""
    monkeypatch.delenv("RANK", raising=False)
    argv = ["--steps", "1", "--eval-every", "50", "--length", "3", "--hidden", "2", "--batch", "2"]
    assert _example().main([*argv, "--backend", "reference", "--target", "0"]) == 0
    assert "step 1: loss" in capsys.readouterr().out
