"""The benchmark protocol of BENCHMARKS.md on this GPU → ``<out>/<gpu>-<date>.json``.

Cells LSTM, GRU, sLSTM (``examples/``), bf16, hidden 768 unless said:

- head-dim sweep (D, NH) ∈ {(16,48), (32,24), (64,12), (128,6), (256,3), (768,1)}, B=16, T=1024;
- batch sweep B ∈ {2, 8, 16, 32, 64, 128, 256} at 12×64 and 1×768 (``--batch-cells``);
- sequence sweep T ∈ {256, 512, 1024, 2048} at B=16, 12×64 and 1×768;
- anchors: cuDNN LSTM fp16/bf16/fp32 at 1×768 B=16, fp16 at 1×256, 1×1024 and B=64; the
  PyTorch loop at bf16, B=16, 1×768 (few repeats: it is slow).

Systems at every point: ``rnncc-stepwise`` (raw cell, ``Wx`` given), ``rnncc-stepwise-module``
(``rnncc.RNN`` with its input projection), ``rnncc-fused[-module]`` (recorded unavailable where no
fused kernel runs the size), and for LSTM/GRU ``torch.nn.LSTM``/``GRU`` (cuDNN) in fp16 and bf16:
cuDNN has one dense head, so it runs once per (cell, B, T, hidden) with NH=1, D=hidden, and
the report compares every head split with it. A point shared by several sweeps is measured
once; its record lists the sweeps. Timing is ``rnncc.bench``'s (CUDA events, warm-up
excluded, rotated inputs below 2× L2, ``fw`` under no_grad, ``fwbw`` with ``.sum().backward()``).

Build: the host loop and every kernel library the rnncc measurements run (the stepwise
libraries and each case's planned fused variant) are built up front, in parallel (wall time,
and whether the cache was cold), then per cell a new process times ``rnncc.load`` to the first
result from the warm cache (``rnncc bench --json``).

Output: the JSON (``{"machine", "protocol", "build", "records"}``) is rewritten atomically
after every measurement, so a timeout leaves what was measured; measurements that would start
after ``--budget-s`` are recorded as skipped; ``--resume FILE`` keeps the measured records of
an earlier run and measures the rest. The run ends with the Markdown tables of
``benchmarks/report.py`` for the anchors and the head-dim sweep on stdout (the full report
and the plots are made on the CPU side: the GPU machine has no matplotlib).

Usage (repository root): python benchmarks/run_suite.py [--out DIR] [--quick]
    [--batch-cells lstm,gru,slstm] [--budget-s 450] [--resume FILE] [--dry-run]

Non-goals: FlashRNN (its numbers are BENCHMARKS.md's); CUDA graphs; plots.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script without the package installed
    sys.path.insert(0, str(ROOT))

from rnncc import bench  # noqa: E402
from rnncc.bench import Case, Record, Settings  # noqa: E402

STARTED = time.perf_counter()
CELLS = ("lstm", "gru", "slstm")
HEAD_DIMS = ((16, 48), (32, 24), (64, 12), (128, 6), (256, 3), (768, 1))
BATCHES = (2, 8, 16, 32, 64, 128, 256)
SEQS = (256, 512, 1024, 2048)
SPLITS = ((12, 64), (1, 768))  # (NH, D) of the batch and sequence sweeps
RNNCC_SYSTEMS = tuple(s for s in bench.DEFAULT_SYSTEMS if s.startswith("rnncc-"))

Key = tuple[str, Case]


def plan(batch_cells: tuple[str, ...], cells: tuple[str, ...] = CELLS) -> dict[Key, list[str]]:
    """Every measurement (system, case) → the sweeps it belongs to, in the order to run them:
    anchors, head dim, sequence length, batch (the largest and least needed last)."""
    items: dict[Key, list[str]] = {}

    def add(system: str, case: Case, sweep: str) -> None:
        sweeps = items.setdefault((system, case), [])
        if sweep not in sweeps:
            sweeps.append(sweep)

    def point(cell: str, B: int, T: int, NH: int, D: int, sweep: str) -> None:
        for system in RNNCC_SYSTEMS:
            add(system, Case(cell, B, T, NH, D, "bf16"), sweep)
        if cell in bench.BASELINES:
            for dtype in ("fp16", "bf16"):
                add("cudnn", Case(cell, B, T, 1, NH * D, dtype), sweep)
        loop = ("torch-loop", Case(cell, B, T, NH, D, "bf16"))
        if loop in items:
            add(*loop, sweep)

    if "lstm" in cells:
        for dtype in ("fp16", "bf16", "fp32"):
            add("cudnn", Case("lstm", 16, 1024, 1, 768, dtype), "anchor")
        for hidden in (256, 1024):
            add("cudnn", Case("lstm", 16, 1024, 1, hidden, "fp16"), "anchor")
        add("cudnn", Case("lstm", 64, 1024, 1, 768, "fp16"), "anchor")
    for cell in cells:
        add("torch-loop", Case(cell, 16, 1024, 1, 768, "bf16"), "anchor")
    for cell in cells:
        for D, NH in HEAD_DIMS:
            point(cell, 16, 1024, NH, D, "headdim")
    for cell in cells:
        for NH, D in SPLITS:
            for T in SEQS:
                point(cell, 16, T, NH, D, "seq")
    for cell in (c for c in cells if c in batch_cells):
        for NH, D in SPLITS:
            for B in BATCHES:
                point(cell, B, 1024, NH, D, "batch")
    return items


def _key(system: str, case: Case) -> tuple[Any, ...]:
    return (system, *dataclasses.astuple(case))


def libraries(items: dict[Key, list[str]], cells: dict[str, Any], caps: Any) -> list[Any]:
    """(cell, build record) of every kernel library the rnncc systems of ``items`` run: per
    case the plan of the system's backend (stepwise, or the cheapest fused variant where one
    runs the size), as ``CompiledCell`` solves it."""
    from rnncc.tiling import Problem, TilingError, solve
    from rnncc.variants import VARIANTS

    by_backend = {
        "stepwise": [v for v in VARIANTS if v.host == "stepwise"],
        "fused": [v for v in VARIANTS if v.host == "fused"],
    }
    found: dict[tuple[str, str], Any] = {}
    for system, case in items:
        if not system.startswith("rnncc-"):
            continue
        cell = cells[case.cell]
        problem = Problem.from_cell(
            cell.ir, heads=case.NH, head_dim=case.D, batch=case.B, dtype=case.dtype
        )
        try:
            plan = solve(problem, caps, by_backend[system.split("-")[1]])
        except TilingError:  # recorded unavailable when measured
            continue
        found.setdefault((cell.name, json.dumps(plan.build, sort_keys=True)), (cell, plan.build))
    return list(found.values())


def build_all(items: dict[Key, list[str]], cells: dict[str, Any]) -> dict[str, Any]:
    """Build (or find in the cache) the host loop and every kernel library the plan's rnncc
    measurements run, all at once (``MAX_JOBS`` builds, else 16); wall time, per-cell times
    (the slowest of its builds) and the libraries this run actually compiled (from the
    cache's builds.log)."""
    import torch

    from rnncc.config import get_config
    from rnncc.runtime.kernels import arch_of, build_kernels, host_library
    from rnncc.tiling import caps_for_device

    log = get_config().cache_dir / "builds.log"
    before = len(log.read_text().splitlines()) if log.exists() else 0
    index = torch.cuda.current_device()
    arch = arch_of(index)
    jobs = libraries(items, cells, caps_for_device(index))

    def one(job: tuple[Any, dict[str, Any]]) -> tuple[Any, float]:
        cell, record = job
        t = time.perf_counter()
        build_kernels(cell.ir, cell.backward_ir, record, arch)
        return cell, time.perf_counter() - t

    t0 = time.perf_counter()
    per_cell: dict[str, float] = {}
    with ThreadPoolExecutor(max_workers=get_config().max_jobs or 16) as pool:
        host = pool.submit(host_library, arch)
        for cell, seconds in pool.map(one, jobs):
            per_cell[cell.name] = max(per_cell.get(cell.name, 0.0), round(seconds, 2))
        host.result()
    built = log.read_text().splitlines()[before:] if log.exists() else []
    return {
        "arch": arch,
        "parallel_wall_s": round(time.perf_counter() - t0, 2),
        "per_cell_s": per_cell,
        "libraries": len(jobs),
        "compiled": [line.split()[0] for line in built],
        "cold_cache": bool(built),
        "cache_dir": str(get_config().cache_dir),
    }


def cached_load(cell_path: Path) -> dict[str, Any]:
    """A new process on the warm cache: ``rnncc.load`` and the first stepwise result."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        cmd = [sys.executable, "-m", "rnncc", "bench", str(cell_path), "--hidden", "64"]
        cmd += ["--batch", "2", "--seq", "16", "--systems", "rnncc-stepwise"]
        cmd += ["--repeats", "1", "--warmup", "0", "--json", str(out)]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        wall = time.perf_counter() - t0
        if proc.returncode != 0 or not out.exists():
            return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
        data = json.loads(out.read_text())
    first = data["records"][0]["first_call_s"]
    return {
        "load_s": data["load_s"],
        "first_call_s": first,
        "load_to_first_result_s": round(data["load_s"] + first, 3),
        "process_wall_s": round(wall, 2),
    }


def measure_all(
    items: dict[Key, list[str]],
    cells: dict[str, Any],
    *,
    device: Any,
    settings: Settings,
    deadline: float = float("inf"),
    kept: dict[tuple[Any, ...], Record] | None = None,
    save: Callable[[list[Record]], None] = lambda records: None,
) -> list[Record]:
    """Run the planned measurements in order, printing one line each and calling ``save``
    with the records so far after each. A measurement found in ``kept`` is reused; one that
    would start after ``deadline`` (``time.perf_counter()``) is recorded as skipped."""
    kept = kept or {}
    records: list[Record] = []
    for k, ((system, case), sweeps) in enumerate(items.items(), 1):
        now = time.perf_counter()
        prefix = f"[{k:3d}/{len(items)} {now - STARTED:4.0f} s] {case.label():34s} {system:22s}"
        key = _key(system, case)
        if key in kept:
            got = [dataclasses.replace(kept[key])]
        elif now > deadline:
            note = "the time budget was spent (--budget-s)"
            got = [Record.for_case(system, case, status="skipped", note=note)]
        else:
            got = bench.run_system(
                system,
                cells[case.cell],
                case,
                device=device,
                settings=settings,
                baseline=case.cell if case.cell in bench.BASELINES else None,
                cudnn_dtypes=(case.dtype,),
            )
        for r in got:
            r.sweeps = list(sweeps)
            print(f"{prefix} {bench.summary(r)}", flush=True)
        records += got
        save(records)
    return records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"), help="output folder")
    ap.add_argument("--quick", action="store_true", help="fewer repeats, batch sweep LSTM only")
    ap.add_argument(
        "--batch-cells", help="cells of the batch sweep (default all; lstm with --quick)"
    )
    ap.add_argument("--cells", default=",".join(CELLS), help="cells to run (default all)")
    ap.add_argument("--repeats", type=int, help="timed calls per measurement (default 10, 5)")
    ap.add_argument("--warmup", type=int, help="warm-up calls (default 2, 1 with --quick)")
    ap.add_argument("--loop-repeats", type=int, help="timed calls of the loop (default 3, 2)")
    ap.add_argument(
        "--budget-s", type=float, default=450.0, help="skip what would start later (default 450)"
    )
    ap.add_argument("--resume", help="a results JSON whose measured records are kept")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    args = ap.parse_args(argv)

    cells_run = tuple(c for c in args.cells.split(",") if c)
    unknown = sorted(set(cells_run) - set(CELLS))
    if unknown:
        ap.error(f"unknown cells {unknown}; choose from {', '.join(CELLS)}")
    batch_cells = tuple(
        (args.batch_cells or ("lstm" if args.quick else ",".join(CELLS))).split(",")
    )
    items = plan(batch_cells, cells_run)
    settings = Settings(
        fwbw=True,
        warmup=args.warmup if args.warmup is not None else (1 if args.quick else 2),
        repeats=args.repeats or (5 if args.quick else 10),
        loop_warmup=1,
        loop_repeats=args.loop_repeats or (2 if args.quick else 3),
        max_loop_s=90.0,
    )
    if args.dry_run:
        for (system, case), sweeps in items.items():
            print(f"{system:22s} {case.label():32s} {','.join(sweeps)}")
        print(f"{len(items)} measurements; {settings}")
        return 0

    import torch

    if not torch.cuda.is_available():
        print("run_suite: error: no CUDA device: the protocol runs on a GPU", file=sys.stderr)
        return 1
    import rnncc

    device = torch.device("cuda", torch.cuda.current_device())
    torch.mm(torch.ones(8, 8, device=device), torch.ones(8, 8, device=device))
    torch.cuda.synchronize()
    machine = bench.machine_info(device)
    print(json.dumps(machine), flush=True)
    out = Path(args.out) / f"{bench.gpu_slug(machine['gpu'])}-{machine['date']}.json"
    protocol = {
        "fw": "forward under torch.no_grad(); cuDNN modules in eval mode",
        "fwbw": "forward with gradients + .sum().backward() on the outputs; grads reset untimed",
        "timer": "CUDA events around each call, device idle before; warm-up calls excluded",
        "inputs": "random (randn; R scaled 1/sqrt(D), b 0.1); several sets rotated when a set "
        "is under 2x L2",
        "module": "rnncc.RNN and torch.nn.LSTM/GRU with input_size = hidden: times include the "
        "input projection",
        "cudnn_heads": "cuDNN runs one dense head of hidden NH*D (NH x the recurrent FLOPs)",
        **dataclasses.asdict(settings),
        "budget_s": args.budget_s,
        "quick": args.quick,
        "batch_cells": list(batch_cells),
    }
    kept: dict[tuple[Any, ...], Record] = {}
    if args.resume:
        old = json.loads(Path(args.resume).read_text())
        for d in old["records"]:
            if d.get("status") == "ok":
                r = Record(**{k: d[k] for k in bench.RECORD_KEYS if k in d})
                kept[_key(r.system, Case(r.cell, r.B, r.T, r.NH, r.D, r.dtype))] = r
        protocol["resumed_from"] = {"file": args.resume, "kept": len(kept)}

    cells = {name: rnncc.load(ROOT / "examples" / f"{name}.rnn") for name in cells_run}
    build: dict[str, Any] = {}

    def save(records: list[Record]) -> None:
        bench.write_results(out, machine, records, protocol=protocol, build=build)

    print(f"building {', '.join(cells)} ...", flush=True)
    build.update(build_all(items, cells))
    print(f"build: {json.dumps(build)}", flush=True)
    build["cached_new_process"] = {}
    for name in ["lstm"] if args.quick and "lstm" in cells else list(cells):
        build["cached_new_process"][name] = got = cached_load(ROOT / "examples" / f"{name}.rnn")
        print(f"cached load in a new process, {name}: {json.dumps(got)}", flush=True)
    save([])

    records = measure_all(
        items,
        cells,
        device=device,
        settings=settings,
        deadline=STARTED + args.budget_s,
        kept=kept,
        save=save,
    )
    print(f"\nwrote {out} ({len(records)} records, {time.perf_counter() - STARTED:.0f} s)\n")
    import report  # benchmarks/report.py, beside this file

    data = json.loads(out.read_text())
    print(f"{report.anchor_table(data)}\n{report.sweep_table(data, 'headdim')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
