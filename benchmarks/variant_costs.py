"""The cost model against the clock: per problem, every kernel variant that runs it, built at
its best point and timed, its predicted µs per step beside the measured.

Problems (``PROBLEMS``): LSTM, GRU and sLSTM (``examples/``), bf16, at 12×64 (block_mma,
grid_mma, stepwise) and 1×768 (grid_mma, stepwise), B = 16 and 64; the LSTM at 2×384 and 6×128
(B = 16), in fp32 at 12×64 and 1×64 (block_ffma, stepwise, B = 16), and at 1×32 bf16 B = 4.
Each variant that stores the problem's dtype runs at its best point,
``rnncc.tiling.solve(problem, caps_for_device(), [variant])``, or is listed with the
constraints that rule it out.

All libraries are built first, at once (``MAX_JOBS`` builds, else 16). Then each variant's
forward (under no_grad) and forward + backward (``.sum().backward()``) are timed at T = 256 and
1024 with ``rnncc.bench``'s timer (CUDA events, median of 10 calls after 3 warm-ups, inputs
random as ``rnncc bench`` draws them and rotated below 2× L2). µs per step is the slope
(t1024 − t256) / 768, so a call's fixed cost drops out; bw = fwbw − fw. Per problem: whether
the planner's first choice (the solve over all variants) is within 10 % of the fastest
variant measured, forward + backward.

Output: the table on stdout and in ``<out>/variant-costs-<gpu>-<date>.txt``; beside it
``.json`` with one record per (problem, variant) in the suite's schema (system
``rnncc-<variant>``, T = 1024) plus the point, the predictions and the slopes, and the
per-problem verdicts.

Usage (GPU machine, repository root):
    python benchmarks/variant_costs.py [--quick | --points | --large-batch] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script without the package installed
    sys.path.insert(0, str(ROOT))

from rnncc import bench  # noqa: E402
from rnncc.bench import Case, Record  # noqa: E402
from rnncc.bench.workloads import DTYPES, Workload  # noqa: E402

#: (cell file in examples/, NH, D, dtype, B).
Spec = tuple[str, int, int, str, int]
PROBLEMS: tuple[Spec, ...] = (
    *((f"{c}.rnn", 12, 64, "bf16", b) for c in ("lstm", "gru", "slstm") for b in (16, 64)),
    *((f"{c}.rnn", 1, 768, "bf16", b) for c in ("lstm", "gru", "slstm") for b in (16, 64)),
    ("lstm.rnn", 2, 384, "bf16", 16),
    ("lstm.rnn", 6, 128, "bf16", 16),
    ("lstm.rnn", 12, 64, "fp32", 16),
    ("lstm.rnn", 1, 64, "fp32", 16),
    ("lstm.rnn", 1, 32, "bf16", 4),
)
#: ``--points``: the grid tier's problems of the benchmark suite, every feasible point timed.
POINTS: tuple[Spec, ...] = tuple(
    (f"{c}.rnn", NH, D, "bf16", B)
    for c in ("lstm", "gru", "slstm")
    for NH, D, B in (
        (6, 128, 16),
        (3, 256, 16),
        (1, 768, 2),
        (1, 768, 16),
        (1, 768, 32),
        (1, 768, 64),
    )
)
#: ``--large-batch``: the batches where the planner leaves the stepwise backend for the grid tier
#: (its stepwise step is bound by float32 arithmetic past a few hundred rows), at T = 32 and 128.
LARGE_BATCH: tuple[Spec, ...] = (
    *(("lstm.rnn", 1, 768, "bf16", b) for b in (256, 1024, 4096)),
    *(("lstm.rnn", 1, 2304, "bf16", b) for b in (64, 256, 1024)),
)
LARGE_BATCH_STEPS = (32, 128)
#: One problem of each tier: block and grid mma, fp32.
QUICK: tuple[Spec, ...] = (
    ("lstm.rnn", 12, 64, "bf16", 16),
    ("lstm.rnn", 1, 768, "bf16", 16),
    ("lstm.rnn", 1, 64, "fp32", 16),
)
STEPS = (256, 1024)
WARMUP, REPEATS = 3, 10
#: The planner's first choice is good when it is at most this much slower than the fastest.
WITHIN = 0.10


@dataclass
class VariantRecord(Record):
    """A variant's record at the longer T, with its best point, the cost model's prediction
    and the measured slope, µs per step (None where not measured)."""

    variant: str = ""
    point: dict[str, Any] = field(default_factory=dict)
    first_choice: bool = False
    fw_ms_t256: float | None = None
    fwbw_ms_t256: float | None = None
    predicted_fw_us: float | None = None
    measured_fw_us: float | None = None
    fw_error_pct: float | None = None
    predicted_bw_us: float | None = None
    measured_bw_us: float | None = None
    bw_error_pct: float | None = None


@dataclass
class Entry:
    """One problem: its cell, case (at the longer T), the planner's first choice, each
    feasible variant's best plan and, per variant ruled out, the binding constraints."""

    cell: Any  # CompiledCell
    case: Case
    first: Any  # Plan
    plans: list[Any]
    ruled_out: dict[str, list[str]]

    def label(self) -> str:
        c = self.case
        return f"{c.cell} {c.NH}x{c.D} {c.dtype} B{c.B}"


def name(plan: Any) -> str:
    """A plan's variant and point, as the tables print it."""
    point = ", ".join(f"{k}={v}" for k, v in plan.point)
    return plan.variant + (f"({point})" if point else "")


def plan_problems(
    specs: tuple[Spec, ...],
    caps: Any,
    every_point: bool = False,
    steps: tuple[int, int] = STEPS,
) -> list[Entry]:
    """Each problem's first choice, and each variant's best plan (``every_point``: every
    feasible plan) or binding constraints."""
    import rnncc
    from rnncc.tiling import Problem, feasible_plans, solve
    from rnncc.tiling.solve import candidates, diagnose, points

    cells: dict[str, Any] = {}
    entries = []
    for file, NH, D, dtype, B in specs:
        if file not in cells:
            cells[file] = rnncc.load(ROOT / "examples" / file)
        cell = cells[file]
        problem = Problem.from_cell(cell.ir, heads=NH, head_dim=D, batch=B, dtype=dtype)
        plans, ruled_out = [], {}
        for v in candidates(problem):
            if points(v, problem, caps):
                plans += (
                    feasible_plans(problem, caps, [v])
                    if every_point
                    else [solve(problem, caps, [v])]
                )
            else:
                ruled_out[v.name] = diagnose(v, problem, caps)
        case = Case(Path(file).stem, B, steps[-1], NH, D, dtype)
        entries.append(Entry(cell, case, solve(problem, caps), plans, ruled_out))
    return entries


def _build_key(entry: Entry, plan: Any) -> tuple[str, str]:
    return entry.cell.name, json.dumps(plan.build, sort_keys=True)


def build_libraries(entries: list[Entry], arch: str) -> dict[tuple[str, str], BaseException]:
    """Build (or find in the cache) the host loop and every variant library of ``entries``,
    at once; the failures by library (a failed build fails its variants' records only)."""
    from rnncc.config import get_config
    from rnncc.runtime.kernels import build_kernels, host_library

    jobs = {_build_key(e, p): (e.cell, p.build) for e in entries for p in e.plans}
    failed: dict[tuple[str, str], BaseException] = {}

    def one(key: tuple[str, str]) -> None:
        cell, record = jobs[key]
        try:
            build_kernels(cell.ir, cell.backward_ir, record, arch)
        except Exception as err:  # reported in the variant's record
            failed[key] = err

    t0 = time.perf_counter()
    workers = get_config().max_jobs or 16
    print(f"building {len(jobs)} libraries and the host loop, {workers} at once ...", flush=True)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        host = pool.submit(host_library, arch)
        list(pool.map(one, jobs))
        host.result()
    print(f"built in {time.perf_counter() - t0:.1f} s ({len(failed)} failed)", flush=True)
    return failed


def workload(cell: Any, ops: Any, launch: Any, case: Case, device: Any) -> Workload:
    """The library's ops at ``launch`` (a plan's, or a pairing of two plans' kernels) on random
    ``Wx``, ``R`` (scaled by 1/√D) and ``b`` (0.1), with the declared initial states and params:
    what ``rnncc bench`` gives the raw cell (also benchmarks/backward_points.py's inputs)."""
    import torch

    dtype = getattr(torch, DTYPES[case.dtype])
    s = cell.shapes(case.B, case.T, case.NH, case.D)
    states = cell.initial_states(case.B, case.NH, case.D, dtype=dtype, device=device)
    params = cell.initial_params(case.NH, case.D, dtype=dtype, device=device)

    def make(seed: int) -> tuple[Any, ...]:
        g = torch.Generator(device=device).manual_seed(seed)

        def randn(shape: tuple[int, ...] | None, scale: float) -> Any:
            if shape is None:
                return None
            t = torch.randn(shape, generator=g, device=device, dtype=dtype)
            return t.mul_(scale).requires_grad_()

        return randn(s["Wx"], 1.0), randn(s["R"], case.D**-0.5), randn(s["b"], 0.1)

    def forward(x: tuple[Any, ...]) -> Any:
        Wx, R, b = x
        return ops(Wx, R, b, states, params, launch)[0]

    itemsize = torch.finfo(dtype).bits // 8
    set_bytes = sum(math.prod(s[k]) * itemsize for k in ("Wx", "R", "b") if s[k] is not None)
    return Workload(forward, make, set_bytes)


def _error_pct(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or measured is None or measured <= 0:
        return None
    return round(100 * (predicted - measured) / measured, 1)


def measure_variant(
    entry: Entry,
    plan: Any,
    ops_for: Any,
    device: Any,
    steps: tuple[int, int] = STEPS,
) -> VariantRecord:
    """Time the variant's forward and forward + backward at each T of ``steps``; the record at
    the longer T, with the slopes."""
    system = f"rnncc-{plan.variant}"
    got = {}
    for T in steps:
        case = Case(entry.case.cell, entry.case.B, T, entry.case.NH, entry.case.D, entry.case.dtype)
        got[T] = bench.time_workload(
            system,
            lambda case=case: workload(entry.cell, ops_for(entry, plan), plan.launch, case, device),
            case,
            device=device,
            fwbw=True,
            warmup=WARMUP,
            repeats=REPEATS,
        )
    short, long = got[steps[0]], got[steps[-1]]
    rec = VariantRecord(**long.as_dict())
    rec.variant, rec.point = plan.variant, dict(plan.point)
    rec.first_choice = name(plan) == name(entry.first)
    rec.fw_ms_t256, rec.fwbw_ms_t256 = short.fw_ms, short.fwbw_ms
    if short.status != "ok":
        rec.status, rec.note = short.status, f"T={steps[0]}: {short.note}"
    rec.predicted_fw_us = round(plan.cost.forward_us, 3)
    rec.predicted_bw_us = round(plan.cost.backward_us, 3)
    if rec.status == "ok" and None not in (short.fw_ms, long.fw_ms, short.fwbw_ms, long.fwbw_ms):
        per_step = 1e3 / (steps[-1] - steps[0])  # ms over the extra steps → µs per step
        fw = (long.fw_ms - short.fw_ms) * per_step  # type: ignore[operator]
        fwbw = (long.fwbw_ms - short.fwbw_ms) * per_step  # type: ignore[operator]
        rec.measured_fw_us, rec.measured_bw_us = round(fw, 3), round(fwbw - fw, 3)
        rec.fw_error_pct = _error_pct(rec.predicted_fw_us, rec.measured_fw_us)
        rec.bw_error_pct = _error_pct(rec.predicted_bw_us, rec.measured_bw_us)
    return rec


def ruled_out_record(entry: Entry, variant: str, binding: list[str]) -> VariantRecord:
    c = entry.case
    return VariantRecord(
        f"rnncc-{variant}",
        c.cell,
        c.dtype,
        c.B,
        c.T,
        c.NH,
        c.D,
        status="unavailable",
        note=f"ruled out by {', '.join(binding)}",
        variant=variant,
    )


def verdict(entry: Entry, records: list[VariantRecord]) -> dict[str, Any]:
    """The planner's first choice against the fastest variant measured (fw + bw per step)."""
    c = entry.case
    timed = {
        r.variant
        + (
            f"({', '.join(f'{k}={v}' for k, v in r.point.items())})" if r.point else ""
        ): r.measured_fw_us + r.measured_bw_us
        for r in records
        if r.measured_fw_us is not None and r.measured_bw_us is not None
    }
    first = name(entry.first)
    fastest = min(timed, key=timed.__getitem__) if timed else None
    within = None
    if fastest is not None and first in timed:
        within = timed[first] - timed[fastest] <= WITHIN * abs(timed[fastest])
    return {
        "cell": c.cell,
        "NH": c.NH,
        "D": c.D,
        "dtype": c.dtype,
        "B": c.B,
        "variants": [name(p) for p in entry.plans],
        "first_choice": first,
        "first_choice_point": dict(entry.first.point),
        "first_choice_fwbw_us": None if first not in timed else round(timed[first], 3),
        "fastest": fastest,
        "fastest_fwbw_us": None if fastest is None else round(timed[fastest], 3),
        "within_10pct": within,
    }


def _us(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:+.0f} %"


def format_report(
    entries: list[Entry],
    records: list[list[VariantRecord]],
    verdicts: list[dict[str, Any]],
    steps: tuple[int, int] = STEPS,
) -> str:
    """The table of every (problem, variant), then a line per problem and the summary."""
    head = ("problem", "variant", "point", "fw pred", "fw meas", "fw err", "bw pred", "bw meas")
    rows = [(*head, "bw err", "note")]
    for entry, recs in zip(entries, records, strict=True):
        for r in recs:
            point = ", ".join(f"{k}={v}" for k, v in r.point.items()) or "—"
            note = "" if r.status == "ok" else f"{r.status}: {r.note}"
            rows.append(
                (
                    entry.label(),
                    r.variant + (" *" if r.first_choice else ""),
                    point if r.status != "unavailable" else "",
                    _us(r.predicted_fw_us),
                    _us(r.measured_fw_us),
                    _pct(r.fw_error_pct),
                    _us(r.predicted_bw_us),
                    _us(r.measured_bw_us),
                    _pct(r.bw_error_pct),
                    note,
                )
            )
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]) - 1)]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)).rstrip()
        + ("  " + row[-1] if row[-1] else "")
        for row in rows
    ]
    lines.insert(
        1,
        f"(µs per step: slope of T = {steps[0]} → {steps[-1]}; bw = fwbw − fw; "
        "* the planner's first choice)",
    )
    lines.append("")
    for v in verdicts:
        label = f"{v['cell']} {v['NH']}x{v['D']} {v['dtype']} B{v['B']}"
        if v["within_10pct"] is None:
            says = "not comparable (the first choice or every variant unmeasured)"
        else:
            ok = "within" if v["within_10pct"] else "NOT within"
            says = (
                f"{v['first_choice']} {_us(v['first_choice_fwbw_us'])} µs/step fw+bw; fastest "
                f"{v['fastest']} {_us(v['fastest_fwbw_us'])}: {ok} {WITHIN:.0%}"
            )
        lines.append(f"{label:24s} first choice {says}")
    lines.append(summary(verdicts))
    return "\n".join(lines)


def summary(verdicts: list[dict[str, Any]]) -> str:
    several = sum(len(v["variants"]) >= 2 for v in verdicts)
    compared = [v for v in verdicts if v["within_10pct"] is not None]
    good = sum(bool(v["within_10pct"]) for v in compared)
    return (
        f"{len(verdicts)} problems, {several} with ≥ 2 feasible variants; the planner's first "
        f"choice within {WITHIN:.0%} of the fastest measured in {good} of {len(compared)} compared"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help=f"{len(QUICK)} problems only")
    ap.add_argument(
        "--points",
        action="store_true",
        help=f"the suite's {len(POINTS)} grid-tier problems, every feasible point of each variant",
    )
    ap.add_argument(
        "--large-batch",
        action="store_true",
        help=f"{len(LARGE_BATCH)} problems at batches of 64 to 4096, T = "
        f"{LARGE_BATCH_STEPS[0]} and {LARGE_BATCH_STEPS[1]}",
    )
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"), help="output folder")
    args = ap.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print(
            "variant_costs: error: no CUDA device: the variants are timed on a GPU", file=sys.stderr
        )
        return 1
    from rnncc.runtime.kernels import KernelOps, arch_of
    from rnncc.tiling import caps_for_device

    index = torch.cuda.current_device()
    device = torch.device("cuda", index)
    machine = bench.machine_info(device)
    print(json.dumps(machine), flush=True)
    caps = caps_for_device(index)
    arch = arch_of(index)
    specs = (
        QUICK
        if args.quick
        else POINTS
        if args.points
        else LARGE_BATCH
        if args.large_batch
        else PROBLEMS
    )
    steps = LARGE_BATCH_STEPS if args.large_batch else STEPS
    entries = plan_problems(specs, caps, every_point=args.points, steps=steps)
    failed = build_libraries(entries, arch)

    kept: dict[tuple[str, str], Any] = {}

    def ops_for(entry: Entry, plan: Any) -> Any:
        key = _build_key(entry, plan)
        if key in failed:
            raise failed[key]
        if key not in kept:
            kept[key] = KernelOps(entry.cell.ir, entry.cell.backward_ir, plan.build, arch)
        return kept[key]

    kind = (
        "point-costs"
        if args.points
        else "large-batch-costs"
        if args.large_batch
        else "variant-costs"
    )
    stem = f"{kind}-{bench.gpu_slug(machine['gpu'])}-{machine['date']}"
    out = Path(args.out)
    protocol = {
        "steps": list(steps),
        "per_step": f"slope of the medians, (t{steps[-1]} - t{steps[0]}) / "
        f"{steps[-1] - steps[0]}, µs; bw = fwbw - fw",
        "fw": "forward under torch.no_grad()",
        "fwbw": "forward with gradients + .sum().backward() on y; grads reset untimed",
        "timer": "CUDA events around each call, device idle before; warm-up calls excluded",
        "warmup": WARMUP,
        "repeats": REPEATS,
        "inputs": "random (randn; R scaled 1/sqrt(D), b 0.1), declared initial states and "
        "params; several sets rotated when a set is under 2x L2",
        "within": WITHIN,
        "quick": args.quick,
    }
    records: list[list[VariantRecord]] = []
    verdicts: list[dict[str, Any]] = []
    for k, entry in enumerate(entries, 1):
        recs = [measure_variant(entry, plan, ops_for, device, steps) for plan in entry.plans]
        recs += [ruled_out_record(entry, v, b) for v, b in entry.ruled_out.items()]
        for r in recs:
            said = "ok" if r.status == "ok" else f"{r.status}: {r.note}"
            print(
                f"[{k:2d}/{len(entries)}] {entry.label():24s} {r.variant:10s} {r.point} fw "
                f"{_us(r.predicted_fw_us)} pred {_us(r.measured_fw_us)} meas, bw "
                f"{_us(r.predicted_bw_us)} pred {_us(r.measured_bw_us)} meas  {said}",
                flush=True,
            )
        records.append(recs)
        verdicts.append(verdict(entry, recs))
        # After every problem, so that a run cut short leaves what it measured.
        bench.write_results(
            out / f"{stem}.json",
            machine,
            [r for rs in records for r in rs],
            protocol=protocol,
            problems=verdicts,
            summary=summary(verdicts),
        )

    text = format_report(entries, records, verdicts, steps)
    print(f"\n{text}")
    (out / f"{stem}.txt").write_text(text + "\n", encoding="utf-8")
    print(f"\nwrote {out / stem}.json and .txt", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
