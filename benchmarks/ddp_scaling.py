"""Data-parallel throughput: training steps of a 2-layer rnncc LSTM under
DistributedDataParallel (NCCL) on 1 and on N GPUs of one host, the batch per GPU fixed, so
N GPUs should give N times the strings per second. A step is the forward, the backward with
DDP's gradient all-reduce, and an Adam step; each rank times its steps with CUDA events.

    python benchmarks/ddp_scaling.py --out benchmarks/results/ddp-scaling-h100x2-DATE.json

Records: ``fwbw_ms`` is the median training step (the slowest rank's), ``note`` the world
size and strings per second; the model is ``examples/train_ddp.py``'s.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rnncc.bench.records import Record, machine_info, write_results

REPO = Path(__file__).resolve().parents[1]
#: (hidden, dtype, batch per GPU, T): the example's size (block tier), and hidden 768 and
#: 1024 in bf16 (grid tier; 1024 puts a cooperative block on 128 of an H100's 132 SMs).
CONFIGS = [
    (64, torch.float32, 128, 64),
    (768, torch.bfloat16, 16, 256),
    (1024, torch.bfloat16, 16, 256),
]
WARMUP, STEPS, REPEATS = 5, 20, 5


def _example():
    spec = importlib.util.spec_from_file_location("train_ddp", REPO / "examples" / "train_ddp.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _worker(rank: int, world: int, store: str, config: tuple, out: str) -> None:
    hidden, dtype, batch, length = config
    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world,
        device_id=torch.device("cuda", rank),
    )
    try:
        example = _example()
        torch.manual_seed(0)
        model = example.ParityModel("lstm", hidden, backend="fused").to("cuda", dtype)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        bits, parity = example.batch(batch, length, seed=rank, device="cuda")
        target = parity.float()

        def step() -> None:
            logits = ddp(bits).float()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, target)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

        for _ in range(WARMUP):
            step()
        per_step = []
        for _ in range(REPEATS):
            torch.cuda.synchronize()
            dist.barrier()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(STEPS):
                step()
            end.record()
            end.synchronize()
            per_step.append(start.elapsed_time(end) / STEPS)
        times = torch.tensor(per_step, device="cuda")
        dist.all_reduce(times, op=dist.ReduceOp.MAX)  # a step ends when its slowest rank does
        if rank == 0:
            backend = model.layers[0].cell.last_backend
            Path(out).write_text(json.dumps({"ms": times.tolist(), "backend": backend}))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def measure(world: int, config: tuple) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        mp.spawn(_worker, args=(world, os.path.join(tmp, "store"), config, out), nprocs=world)
        return json.loads(Path(out).read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--gpus", type=int, default=torch.cuda.device_count())
    args = ap.parse_args()
    if args.gpus < 2:
        raise SystemExit(f"ddp_scaling: needs 2 or more GPUs, this machine has {args.gpus}")
    records = []
    for config in CONFIGS:
        hidden, dtype, batch, length = config
        one = None
        for world in (1, args.gpus):
            got = measure(world, config)
            ms = statistics.median(got["ms"])
            rate = world * batch / (ms / 1e3)
            one = one or rate
            dt = {torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]
            note = (
                f"world size {world}, {world * batch} strings a step, {rate:.0f} strings/s, "
                f"{rate / one:.2f}x one GPU; 2 layers; backend {got['backend']}"
            )
            rec = Record("rnncc DDP (NCCL)", "lstm", dt, batch, length, 1, hidden, note=note)
            rec.fwbw_ms, rec.fwbw_range_ms = (
                round(ms, 4),
                [round(min(got["ms"]), 4), round(max(got["ms"]), 4)],
            )
            rec.repeats, rec.warmup = REPEATS, WARMUP
            records.append(rec)
            print(
                f"hidden {hidden:5d} {dt} B/GPU {batch:3d} T {length:4d}: {ms:8.3f} ms/step, {note}",
                flush=True,
            )
    if args.out:
        write_results(Path(args.out), machine_info(torch.device("cuda")), records, gpus=args.gpus)


if __name__ == "__main__":
    main()
