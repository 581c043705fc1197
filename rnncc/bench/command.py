"""``rnncc bench``: time a cell on rnncc's backends and on the baselines, in one process.

Input: a compiled cell, sizes (B, T, NH, D), a storage dtype and the systems to time. Output:
one ``Record`` per system and dtype — median and spread of the forward (``fw``) and of the
forward plus ``.sum().backward()`` on the outputs (``fwbw``) in ms, and the first call in s —
printed as a table or written as JSON ``{"machine": {...}, "records": [...]}``, the schema
that ``benchmarks/run_suite.py`` writes and ``benchmarks/report.py`` reads.

Systems:

- ``rnncc-<backend>``: the raw cell, ``cell(Wx, R, b, backend=...)`` with ``Wx`` given;
- ``rnncc-<backend>-module``: ``rnncc.RNN`` (input size = hidden), whose time includes its
  input projection: the fair comparison with ``torch.nn.LSTM``, whose time includes its own;
- ``cudnn``: ``torch.nn.LSTM``/``torch.nn.GRU`` (input size = hidden, batch_first) in fp16
  and in the requested dtype, for a cell whose IR is that of ``examples/lstm.rnn`` or
  ``examples/gru.rnn`` (or with ``baseline=``). cuDNN has one head: for NH > 1 it runs one
  dense layer of hidden NH·D (NH× the recurrent FLOPs); its record says so and carries
  NH = 1, D = NH·D, the sizes that ran;
- ``torch-loop``: the reference backend, a PyTorch loop of one matmul and the cell's torch
  ops per step. It is slow: skipped with a note when its estimated time exceeds a limit.

Timing (the GPU method): CUDA events around each call (a host clock on the CPU), the device
synchronised before each call, warm-up calls excluded, median, quartiles and range over the
timed calls. Inputs are random, never zeros; when one input set is smaller than twice the L2
cache, several sets are generated up front and the calls rotate among them, so that no call
finds its inputs in the cache. ``fw`` runs under ``torch.no_grad()`` (an inference forward,
nothing saved for backward); ``fwbw`` runs with gradients, and gradients are reset to None
between calls outside the timed region. The first call of each system, which builds or loads
its libraries on first use, is timed apart with a host clock (``first_call_s``).

Invariants: a system that cannot run here (no CUDA, no fused kernel, no cuDNN counterpart)
gives a record with status ``unavailable`` and the reason, and a failing one (out of memory,
a build error) status ``failed``: one system never stops the others; torch is imported on
first use, not when the CLI builds its parser.

Non-goals: third-party baselines (FlashRNN); CUDA-graph replay timings; plots and Markdown
(``benchmarks/report.py``); the suite of sizes (``benchmarks/run_suite.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rnncc.errors import RnnccError, TilingError

if TYPE_CHECKING:
    import torch

    from rnncc.ir.cell import Cell
    from rnncc.runtime.api import CompiledCell

#: Storage dtypes by their short names.
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
#: The rnncc backends timed by default (``fused`` is reported unavailable until it exists).
RNNCC_BACKENDS = ("stepwise", "fused")
DEFAULT_SYSTEMS = (
    *(f"rnncc-{b}{m}" for b in RNNCC_BACKENDS for m in ("", "-module")),
    "cudnn",
    "torch-loop",
)
#: Cells with a cuDNN counterpart, by the example file whose IR they must equal.
BASELINES = {"lstm": "LSTM", "gru": "GRU"}
EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"
MAX_INPUT_SETS = 8
_L2_FALLBACK = 50 * 2**20  # an H100's L2, for devices that do not report theirs
#: Forward + backward of the PyTorch loop over its forward alone (BENCHMARKS.md: 632 / 164).
_LOOP_FWBW_OVER_FW = 4.0

Timer = Callable[[Callable[[], object]], float]
"""Runs a callable once and returns its time in ms."""


# ---- statistics and timing ---------------------------------------------------------------


@dataclass(frozen=True)
class Stats:
    """Summary of timed calls, in ms: median, quartiles (inclusive method) and range."""

    median: float
    q1: float
    q3: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> Stats:
        if not samples:
            raise ValueError("no timed calls to summarise")
        xs = sorted(samples)
        q1, q3 = (
            (xs[0], xs[0])
            if len(xs) == 1
            else statistics.quantiles(xs, n=4, method="inclusive")[::2]
        )
        return cls(statistics.median(xs), q1, q3, xs[0], xs[-1], len(xs))


def cuda_timer(fn: Callable[[], object]) -> float:
    """One call between two CUDA events on the current stream, the device idle before."""
    import torch

    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end))


def host_timer(fn: Callable[[], object]) -> float:
    """One call timed with the host clock (CPU tensors: the work is done on return)."""
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def input_sets(set_bytes: int, l2_bytes: int, max_sets: int = MAX_INPUT_SETS) -> int:
    """How many input sets to rotate among: one when a set alone is at least twice the L2
    cache, else enough that the sets together are (so each is evicted before its next use),
    at most ``max_sets``."""
    if set_bytes >= 2 * l2_bytes:
        return 1
    return max(1, min(max_sets, math.ceil(2 * l2_bytes / max(set_bytes, 1))))


def measure(
    run: Callable[[int], object],
    *,
    n_sets: int,
    warmup: int,
    repeats: int,
    timer: Timer,
    reset: Callable[[], None] | None = None,
) -> Stats:
    """Time ``run(k % n_sets)`` for ``warmup + repeats`` calls (``reset`` before each, not
    timed) and summarise the last ``repeats``."""
    if repeats < 1 or warmup < 0 or n_sets < 1:
        raise ValueError(
            f"need repeats ≥ 1, warmup ≥ 0, n_sets ≥ 1; got {repeats}, {warmup}, {n_sets}"
        )
    samples = []
    for k in range(warmup + repeats):
        if reset is not None:
            reset()
        ms = timer(functools.partial(run, k % n_sets))
        if k >= warmup:
            samples.append(ms)
    return Stats.of(samples)


# ---- records -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """What one measurement runs: a cell at sizes and a storage dtype (a key of DTYPES)."""

    cell: str
    B: int
    T: int
    NH: int
    D: int
    dtype: str

    @property
    def hidden(self) -> int:
        return self.NH * self.D

    def label(self) -> str:
        return f"{self.cell} B={self.B} T={self.T} {self.NH}×{self.D} {self.dtype}"


@dataclass
class Record:
    """One measurement, as JSON: times in ms (``None`` where not measured), spreads as
    ``[q1, q3]`` and ``[min, max]``; ``status`` is ``ok``, ``unavailable``, ``skipped`` or
    ``failed`` (``note`` says why, or what differs from the other systems)."""

    system: str
    cell: str
    dtype: str
    B: int
    T: int
    NH: int
    D: int
    fw_ms: float | None = None
    fwbw_ms: float | None = None
    fw_iqr_ms: list[float] | None = None
    fwbw_iqr_ms: list[float] | None = None
    fw_range_ms: list[float] | None = None
    fwbw_range_ms: list[float] | None = None
    repeats: int = 0
    warmup: int = 0
    input_sets: int = 0
    first_call_s: float | None = None
    status: str = "ok"
    note: str = ""
    sweeps: list[str] = field(default_factory=list)

    @classmethod
    def for_case(cls, system: str, case: Case, **kw: Any) -> Record:
        return cls(system, case.cell, case.dtype, case.B, case.T, case.NH, case.D, **kw)

    def set_stats(self, phase: str, s: Stats) -> None:
        setattr(self, f"{phase}_ms", round(s.median, 4))
        setattr(self, f"{phase}_iqr_ms", [round(s.q1, 4), round(s.q3, 4)])
        setattr(self, f"{phase}_range_ms", [round(s.min, 4), round(s.max, 4)])

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


RECORD_KEYS = tuple(f.name for f in dataclasses.fields(Record))


# ---- workloads ---------------------------------------------------------------------------


@dataclass
class Workload:
    """A system ready to run: ``make_inputs(seed)`` draws one input set (a tuple whose
    tensors require grad), ``forward(inputs)`` returns the tensor whose sum is the loss."""

    forward: Callable[[tuple[Any, ...]], torch.Tensor]
    make_inputs: Callable[[int], tuple[Any, ...]]
    set_bytes: int
    parameters: Sequence[torch.Tensor] = ()
    note: str = ""


def _dtype(name: str) -> torch.dtype:
    import torch

    if name not in DTYPES:
        raise RnnccError(f"unknown dtype {name!r}; expected one of {', '.join(DTYPES)}")
    return getattr(torch, DTYPES[name])  # type: ignore[no-any-return]


def _randn(shape: Sequence[int], dtype: str, device: Any, g: Any, scale: float = 1.0) -> Any:
    import torch

    t = torch.randn(tuple(shape), generator=g, device=device, dtype=_dtype(dtype))
    return t.mul_(scale).requires_grad_()


def _bytes(shapes: Sequence[Sequence[int] | None], dtype: str) -> int:
    itemsize = 4 if dtype == "fp32" else 2
    return sum(math.prod(s) * itemsize for s in shapes if s is not None)


def cell_workload(cell: CompiledCell, case: Case, backend: str, device: Any) -> Workload:
    """The raw cell on ``backend``: random ``Wx``, ``R`` (scaled by 1/√D), ``b``; the
    declared initial states and params."""
    import torch

    s = cell.shapes(case.B, case.T, case.NH, case.D)

    def make(seed: int) -> tuple[Any, ...]:
        g = torch.Generator(device=device).manual_seed(seed)
        return (
            _randn(s["Wx"], case.dtype, device, g),  # type: ignore[arg-type]
            None if s["R"] is None else _randn(s["R"], case.dtype, device, g, case.D**-0.5),
            None if s["b"] is None else _randn(s["b"], case.dtype, device, g, 0.1),
        )

    def forward(x: tuple[Any, ...]) -> torch.Tensor:
        Wx, R, b = x
        return cell(Wx, R, b, backend=backend)[0]

    return Workload(forward, make, _bytes([s["Wx"], s["R"], s["b"]], case.dtype))


def module_workload(cell: CompiledCell, case: Case, backend: str, device: Any) -> Workload:
    """``rnncc.RNN`` with its input projection (input size = hidden) on ``backend``."""
    import torch

    from rnncc.runtime.module import RNN

    layer = RNN(
        cell,
        case.hidden,
        case.hidden,
        num_heads=case.NH,
        backend=backend,
        device=device,
        dtype=_dtype(case.dtype),
    )
    shape = (case.B, case.T, case.hidden)

    def make(seed: int) -> tuple[Any, ...]:
        return (
            _randn(shape, case.dtype, device, torch.Generator(device=device).manual_seed(seed)),
        )

    return Workload(
        lambda x: layer(x[0])[0], make, _bytes([shape], case.dtype), list(layer.parameters())
    )


def cudnn_workload(baseline: str, case: Case, device: Any) -> Workload:
    """``torch.nn.LSTM``/``GRU`` of hidden ``case.hidden`` (input size = hidden, batch_first);
    training mode only when gradients are on, so ``fw`` runs cuDNN's inference forward."""
    import torch

    cls = getattr(torch.nn, BASELINES[baseline])
    layer = cls(case.hidden, case.hidden, batch_first=True, device=device, dtype=_dtype(case.dtype))
    shape = (case.B, case.T, case.hidden)

    def make(seed: int) -> tuple[Any, ...]:
        return (
            _randn(shape, case.dtype, device, torch.Generator(device=device).manual_seed(seed)),
        )

    def forward(x: tuple[Any, ...]) -> torch.Tensor:
        layer.train(torch.is_grad_enabled())
        return layer(x[0])[0]  # type: ignore[no-any-return]

    return Workload(
        forward,
        make,
        _bytes([shape], case.dtype),
        list(layer.parameters()),
        f"torch.nn.{BASELINES[baseline]} (cuDNN {torch.backends.cudnn.version()})",
    )


def detect_baseline(ir: Cell, examples: Path = EXAMPLES_DIR) -> str | None:
    """``"lstm"`` or ``"gru"`` when ``ir`` equals that example's IR up to the cell's name,
    else None (also when the examples are not there, as in an installed wheel)."""
    from rnncc.runtime.api import load

    for name in BASELINES:
        path = examples / f"{name}.rnn"
        if path.is_file() and dataclasses.replace(ir, name=name) == load(path).ir:
            return name
    return None


# ---- running systems ---------------------------------------------------------------------


def _sync(device: Any) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def l2_bytes(device: Any) -> int:
    import torch

    if not str(device).startswith("cuda"):
        return _L2_FALLBACK
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "L2_cache_size", 0) or _L2_FALLBACK)


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


# ---- machine and results -----------------------------------------------------------------


def _nvidia_smi(index: int) -> dict[str, str]:
    query = "name,driver_version,clocks.sm,clocks.max.sm,power.limit,pstate"
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader", f"--id={index}"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    values = [v.strip() for v in out.strip().splitlines()[0].split(",")] if out.strip() else []
    keys = ["smi_name", "driver", "clock_sm", "clock_max_sm", "power_limit", "pstate"]
    return dict(zip(keys, values))


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=Path(__file__).resolve().parents[2],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def machine_info(device: Any) -> dict[str, Any]:
    """GPU name, driver, SM count, L2, torch, CUDA and cuDNN versions (or the CPU's name)."""
    import torch

    from rnncc import __version__

    info: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "rnncc": __version__,
        "rnncc_commit": _git_commit(),
        "cpu": platform.processor() or platform.machine(),
    }
    if str(device).startswith("cuda"):
        index = torch.device(device).index or 0
        p = torch.cuda.get_device_properties(index)
        info.update(
            gpu=p.name,
            capability=f"{p.major}.{p.minor}",
            sm_count=p.multi_processor_count,
            l2_bytes=l2_bytes(torch.device("cuda", index)),
            memory_gib=round(p.total_memory / 2**30, 1),
            cudnn=torch.backends.cudnn.version(),
            cudnn_allow_tf32=torch.backends.cudnn.allow_tf32,
            matmul_allow_tf32=torch.backends.cuda.matmul.allow_tf32,
        )
        info.update(_nvidia_smi(index))
    else:
        info["gpu"] = None
    return info


def gpu_slug(name: str | None) -> str:
    """``NVIDIA H100 80GB HBM3`` → ``nvidia-h100-80gb-hbm3`` (``cpu`` without a GPU)."""
    return re.sub(r"[^a-z0-9]+", "-", (name or "cpu").lower()).strip("-") or "gpu"


def write_results(
    path: Path, machine: dict[str, Any], records: Sequence[Record], **extra: Any
) -> None:
    """Write ``{"machine", "records", **extra}`` atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"machine": machine, **extra, "records": [r.as_dict() for r in records]}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def fmt_ms(x: float) -> str:
    """A time in ms with 3–4 significant digits and no exponent."""
    return f"{x:.{max(0, 2 - math.floor(math.log10(abs(x))))}f}" if x else "0"


def _fmt(median: float | None, iqr: list[float] | None) -> str:
    if median is None:
        return "—"
    spread = f" [{fmt_ms(iqr[0])}–{fmt_ms(iqr[1])}]" if iqr else ""
    return f"{fmt_ms(median)}{spread}"


def format_table(records: Sequence[Record]) -> str:
    """A plain-text table: system, dtype, fw and fwbw medians [IQR] in ms, first call, note."""
    head = ("system", "dtype", "fw ms [IQR]", "fwbw ms [IQR]", "first call", "note")
    rows = [head]
    for r in records:
        note = r.note if r.status == "ok" else f"{r.status}: {r.note}"
        first = "—" if r.first_call_s is None else f"{r.first_call_s:.3g} s"
        rows.append(
            (
                r.system,
                r.dtype,
                _fmt(r.fw_ms, r.fw_iqr_ms),
                _fmt(r.fwbw_ms, r.fwbw_iqr_ms),
                first,
                note,
            )
        )
    widths = [max(len(row[k]) for row in rows) for k in range(len(head) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1] for row in rows]
    return "\n".join(line.rstrip() for line in lines)


# ---- the command -------------------------------------------------------------------------


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
        type=float,
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
    except OSError as err:
        raise RnnccError(f"{args.file}: cannot read: {err.strerror or err}") from None
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
        write_results(
            Path(args.json),
            machine_info(device),
            records,
            load_s=round(load_s, 4),
            arguments={k: v for k, v in vars(args).items() if k != "func"},
        )
    if not any(r.status == "ok" for r in records):
        why: dict[str, list[str]] = {}
        for r in records:
            why.setdefault(f"{r.status} ({r.note})", []).append(r.system)
        reasons = "; ".join(f"{', '.join(dict.fromkeys(s))}: {w}" for w, s in why.items())
        print(f"rnncc bench: error: nothing could be measured: {reasons}", file=sys.stderr)
        return 1
    return 0
