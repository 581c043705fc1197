"""Time the systems and the ``rnncc bench`` command. Each system's first call (which builds or
loads its libraries) is timed apart; ``fw`` runs under ``torch.no_grad()``, ``fwbw`` runs the
forward and ``.sum().backward()``. A system that cannot run here is ``unavailable``, one that
fails ``failed``: neither stops the others. ``torch-loop`` is skipped when its estimated time
exceeds a limit; cuDNN has one head, so for NH > 1 it runs one dense layer of hidden NH·D."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import platform
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rnncc.bench.records import Record, fmt_ms, format_table, machine_info, write_results
from rnncc.bench.timing import Timer, cuda_timer, host_timer, input_sets, measure
from rnncc.bench.workloads import (
    BASELINES,
    DTYPES,
    Case,
    Workload,
    cell_workload,
    cudnn_workload,
    detect_baseline,
    l2_bytes,
    module_workload,
)
from rnncc.errors import RnnccError, TilingError

if TYPE_CHECKING:
    from rnncc.runtime.api import CompiledCell

#: The rnncc backends timed by default (``fused`` is reported unavailable until it exists).
RNNCC_BACKENDS = ("stepwise", "fused")
DEFAULT_SYSTEMS = (
    *(f"rnncc-{b}{m}" for b in RNNCC_BACKENDS for m in ("", "-module")),
    "cudnn",
    "torch-loop",
)
#: Forward + backward of the PyTorch loop over its forward alone (BENCHMARKS.md: 632 / 164).
_LOOP_FWBW_OVER_FW = 4.0


def _sync(device: Any) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def _reason(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"


def time_workload(
    system: str,
    build: Callable[[], Workload],
    case: Case,
    *,
    device: Any,
    fwbw: bool,
    warmup: int,
    repeats: int,
    timer: Timer | None = None,
    note: str = "",
) -> Record:
    """Build the workload, time its first call, then ``fw`` (and ``fwbw``); never raises
    for the system's own failures: they become the record's status and note."""
    import torch

    rec = Record.for_case(system, case, repeats=repeats, warmup=warmup, note=note)
    timer = timer or (cuda_timer if str(device).startswith("cuda") else host_timer)
    phase = "setup"
    try:
        w = build()
        rec.note = "; ".join(filter(None, [w.note, note]))
        sets = [w.make_inputs(0)]
        phase = "first call"
        t0 = time.perf_counter()
        with torch.no_grad():
            w.forward(sets[0])
        _sync(device)
        rec.first_call_s = round(time.perf_counter() - t0, 4)
        phase = "inputs"
        n = input_sets(w.set_bytes, l2_bytes(device))
        sets += [w.make_inputs(k) for k in range(1, n)]
        rec.input_sets = n
        phase = "fw"
        with torch.no_grad():
            rec.set_stats(
                "fw",
                measure(
                    lambda k: w.forward(sets[k]),
                    n_sets=n,
                    warmup=warmup,
                    repeats=repeats,
                    timer=timer,
                ),
            )
        if fwbw:
            phase = "fwbw"
            leaves = [t for s in sets for t in s if t is not None] + list(w.parameters)

            def reset() -> None:
                for t in leaves:
                    t.grad = None

            rec.set_stats(
                "fwbw",
                measure(
                    lambda k: w.forward(sets[k]).sum().backward(),
                    n_sets=n,
                    warmup=warmup,
                    repeats=repeats,
                    timer=timer,
                    reset=reset,
                ),
            )
            reset()
    except TilingError as err:
        rec.status, rec.note = "unavailable", str(err).splitlines()[0]
    except Exception as err:  # one system's failure (OOM, build error) must not stop the rest
        rec.status = "failed"
        rec.note = "; ".join(filter(None, [rec.note, f"{phase}: {_reason(err)}"]))
    return rec


def estimate_loop_seconds(
    cell: CompiledCell, case: Case, *, device: Any, fwbw: bool, calls: int, probe_steps: int = 8
) -> float:
    """Seconds that ``calls`` calls of the PyTorch loop would take at ``case``, from two
    forward calls over ``probe_steps`` steps (the second timed) scaled by T."""
    import torch

    steps = min(case.T, probe_steps)
    probe = dataclasses.replace(case, T=steps)
    w = cell_workload(cell, probe, "reference", device)
    x = w.make_inputs(0)
    with torch.no_grad():
        w.forward(x)
        _sync(device)
        t0 = time.perf_counter()
        w.forward(x)
        _sync(device)
    per_step = (time.perf_counter() - t0) / steps
    return per_step * case.T * calls * (1 + (_LOOP_FWBW_OVER_FW if fwbw else 0))


def parse_systems(spec: str | Sequence[str] | None) -> list[str]:
    """System names from ``--systems`` (comma or space separated); RnnccError on unknown."""
    if spec is None:
        return list(DEFAULT_SYSTEMS)
    items = spec.replace(",", " ").split() if isinstance(spec, str) else list(spec)
    out = []
    for s in items:
        m = re.fullmatch(r"rnncc-(\w+?)(-module)?", s)
        if not (
            s in ("cudnn", "torch-loop") or (m and m.group(1) in ("stepwise", "fused", "reference"))
        ):
            known = ", ".join(DEFAULT_SYSTEMS)
            raise RnnccError(f"unknown system {s!r}; known: {known} (and rnncc-reference[-module])")
        if s not in out:
            out.append(s)
    if not out:
        raise RnnccError("--systems names no system")
    return out


@dataclass
class Settings:
    """How to time: calls per system and the limit on the PyTorch loop's estimated time."""

    fwbw: bool = True
    warmup: int = 3
    repeats: int = 20
    loop_warmup: int = 1
    loop_repeats: int = 3
    max_loop_s: float = 120.0


def run_system(
    system: str,
    cell: CompiledCell,
    case: Case,
    *,
    device: Any,
    settings: Settings,
    baseline: str | None = None,
    timer: Timer | None = None,
    cudnn_dtypes: Sequence[str] | None = None,
) -> list[Record]:
    """The records of one system at ``case``; for ``cudnn`` one per dtype of
    ``cudnn_dtypes`` (default: fp16 and the case's dtype)."""
    cuda = str(device).startswith("cuda")
    s = settings
    if system == "cudnn":
        import torch

        why = ""
        if baseline is None:
            why = (
                f"cell '{cell.name}' is neither examples/lstm.rnn nor examples/gru.rnn "
                "(pass --baseline lstm|gru to compare anyway)"
            )
        elif not cuda:
            why = "needs CUDA"
        elif not torch.backends.cudnn.is_available():
            why = "cuDNN is not available to torch here"
        if baseline is None or why:
            return [Record.for_case(system, case, status="unavailable", note=why)]
        dense = dataclasses.replace(case, NH=1, D=case.hidden)
        note = (
            f"one dense {case.hidden}×{case.hidden} R per gate for the cell's {case.NH} heads "
            f"of {case.D}: {case.NH}× the recurrent FLOPs"
            if case.NH > 1
            else ""
        )
        return [
            time_workload(
                system,
                functools.partial(cudnn_workload, baseline, c, device),
                c,
                device=device,
                fwbw=s.fwbw,
                warmup=s.warmup,
                repeats=s.repeats,
                timer=timer,
                note=note,
            )
            for c in (
                dataclasses.replace(dense, dtype=d)
                for d in dict.fromkeys(cudnn_dtypes or ("fp16", case.dtype))
            )
        ]
    if system == "torch-loop":
        try:
            est = estimate_loop_seconds(
                cell, case, device=device, fwbw=s.fwbw, calls=1 + s.loop_warmup + s.loop_repeats
            )
        except Exception as err:  # e.g. out of memory: this system fails, not the run
            why = f"estimating its time: {_reason(err)}"
            return [Record.for_case(system, case, status="failed", note=why)]
        if est > s.max_loop_s:
            why = (
                f"estimated {est:.0f} s on {device}, over the limit of {s.max_loop_s:.0f} s "
                "(raise --max-loop-seconds or use a smaller --seq/--batch)"
            )
            return [Record.for_case(system, case, status="skipped", note=why)]
        return [
            time_workload(
                system,
                lambda: cell_workload(cell, case, "reference", device),
                case,
                device=device,
                fwbw=s.fwbw,
                warmup=s.loop_warmup,
                repeats=s.loop_repeats,
                timer=timer,
                note="the reference backend: per step one matmul and the cell's torch ops",
            )
        ]
    backend = system.removeprefix("rnncc-").removesuffix("-module")
    if backend != "reference" and not cuda:
        return [Record.for_case(system, case, status="unavailable", note="needs CUDA")]
    make = module_workload if system.endswith("-module") else cell_workload
    return [
        time_workload(
            system,
            lambda: make(cell, case, backend, device),
            case,
            device=device,
            fwbw=s.fwbw,
            warmup=s.warmup,
            repeats=s.repeats,
            timer=timer,
        )
    ]


def _seconds(text: str) -> float:
    """An argparse type for --max-loop-seconds: a finite time above 0 (nan compares false
    with every estimate, so it would never skip the loop)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``bench`` to an argparse subparsers object; its ``func`` default is ``run``."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "bench",
        help="time a cell on rnncc's backends, cuDNN and the PyTorch loop",
        description="Time a cell's forward (and with --backward forward + backward) on every "
        "rnncc backend and on the baselines, in one process: CUDA events, warm-up excluded, "
        "median and interquartile range. Progress goes to stderr, the table to stdout.",
    )
    p.add_argument("file", metavar="FILE", help="the .rnn file")
    p.add_argument("--cell", metavar="NAME", help="the cell to time when the file has several")
    p.add_argument("--hidden", type=int, required=True, help="hidden size = heads × head dim")
    p.add_argument("--heads", type=int, default=1, help="number of heads NH (default 1)")
    p.add_argument("--batch", type=int, default=16, help="batch size B (default 16)")
    p.add_argument("--seq", type=int, default=1024, help="sequence length T (default 1024)")
    p.add_argument(
        "--dtype", default="bf16", choices=list(DTYPES), help="storage dtype (default bf16)"
    )
    p.add_argument("--backward", action="store_true", help="also time forward + backward")
    p.add_argument("--repeats", type=int, default=20, help="timed calls per system (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls first (default 3)")
    p.add_argument(
        "--systems",
        help=f"comma-separated systems to time (default: {','.join(DEFAULT_SYSTEMS)})",
    )
    p.add_argument(
        "--baseline",
        choices=list(BASELINES),
        help="the cuDNN cell to compare with (default: detected from the cell's IR)",
    )
    p.add_argument(
        "--loop-repeats",
        type=int,
        default=3,
        help="timed calls of the slow PyTorch loop (default 3)",
    )
    p.add_argument(
        "--max-loop-seconds",
        type=_seconds,
        default=120.0,
        help="skip the PyTorch loop when its estimated time is longer (default 120)",
    )
    p.add_argument("--json", metavar="OUT", help="also write the records as JSON to OUT")
    p.set_defaults(func=run)
    return p


def _progress(msg: str) -> None:
    print(f"rnncc bench: {msg}", file=sys.stderr, flush=True)


def summary(r: Record) -> str:
    if r.status != "ok":
        return f"{r.status} ({r.note})"
    times = [f"{k} {fmt_ms(v)} ms" for k in ("fw", "fwbw") if (v := getattr(r, f"{k}_ms"))]
    return ", ".join(times)


def run(args: argparse.Namespace) -> int:
    """Time the systems and print the table; 0 when at least one system was measured."""
    from rnncc.errors import SourceReadError
    from rnncc.runtime.api import load

    if args.heads < 1 or args.hidden < 1 or args.hidden % args.heads:
        raise RnnccError(
            f"--hidden {args.hidden} is not a positive multiple of --heads {args.heads}"
        )
    for name in ("batch", "seq", "repeats"):
        if getattr(args, name) < 1:
            raise RnnccError(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.warmup < 0 or args.loop_repeats < 1:
        raise RnnccError("--warmup must be ≥ 0 and --loop-repeats ≥ 1")
    systems = parse_systems(args.systems)
    t0 = time.perf_counter()
    try:
        cell = load(args.file, cell=args.cell)
    except SourceReadError as err:  # the tool's error, as every command's (cli._read)
        raise RnnccError(str(err)) from None
    except ValueError as err:  # no such cell in the file
        raise RnnccError(str(err)) from None
    load_s = time.perf_counter() - t0

    import torch

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    if cuda:  # the context and the cuBLAS handle belong to no system: create them untimed
        torch.mm(torch.ones(8, 8, device=device), torch.ones(8, 8, device=device))
        torch.cuda.synchronize()
    else:
        _progress(
            "CUDA is not available: the rnncc CUDA backends and cuDNN need a CUDA GPU; "
            "only the PyTorch loop (the reference backend) runs here, on the CPU"
        )
    baseline = args.baseline or detect_baseline(cell.ir)
    case = Case(cell.name, args.batch, args.seq, args.heads, args.hidden // args.heads, args.dtype)
    settings = Settings(
        fwbw=args.backward,
        warmup=args.warmup,
        repeats=args.repeats,
        loop_repeats=args.loop_repeats,
        max_loop_s=args.max_loop_seconds,
    )
    records: list[Record] = []
    for k, system in enumerate(systems, 1):
        _progress(f"[{k}/{len(systems)}] {system}: {case.label()} ...")
        got = run_system(system, cell, case, device=device, settings=settings, baseline=baseline)
        for r in got:
            _progress(f"[{k}/{len(systems)}] {system} {r.dtype}: {summary(r)}")
        records += got
    where = torch.cuda.get_device_name(device) if cuda else f"CPU ({platform.machine()})"
    print(
        f"{case.label()} (hidden {case.hidden}) on {where}; median [IQR] of {args.repeats} "
        f"timed calls ({args.loop_repeats} for torch-loop), warm-up excluded"
    )
    print(format_table(records))
    if args.json:
        try:
            write_results(
                Path(args.json),
                machine_info(device),
                records,
                load_s=round(load_s, 4),
                arguments={k: v for k, v in vars(args).items() if k != "func"},
            )
        except OSError as err:
            raise RnnccError(f"{args.json}: cannot write: {err.strerror or err}") from None
    if not any(r.status == "ok" for r in records):
        why: dict[str, list[str]] = {}
        for r in records:
            why.setdefault(f"{r.status} ({r.note})", []).append(r.system)
        reasons = "; ".join(f"{', '.join(dict.fromkeys(s))}: {w}" for w, s in why.items())
        print(f"rnncc bench: error: nothing could be measured: {reasons}", file=sys.stderr)
        return 1
    return 0
