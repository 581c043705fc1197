"""One ``Record`` per system and dtype, and where records go: a plain-text table, or JSON
``{"machine": {...}, "records": [...]}`` with the machine's GPU, driver and versions, the
schema that ``benchmarks/run_suite.py`` writes and ``benchmarks/report.py`` reads."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import platform
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rnncc.bench.workloads import l2_bytes

if TYPE_CHECKING:
    from rnncc.bench.timing import Stats
    from rnncc.bench.workloads import Case


@dataclass
class Record:
    """One measurement, as JSON: times in ms (``None`` where not measured), spreads as
    ``[q1, q3]`` and ``[min, max]``; ``status`` is ``ok``, ``unavailable``, ``skipped`` or
    ``failed`` (``note`` says why, or what differs from the other systems). ``problem`` holds
    the problem's other fields where they apply (``num_layers``, ``bidirectional``, ``packed``,
    ``lengths``, ...), written beside the others, not nested."""

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
    problem: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def for_case(cls, system: str, case: Case, **kw: Any) -> Record:
        return cls(system, case.cell, case.dtype, case.B, case.T, case.NH, case.D, **kw)

    def set_stats(self, phase: str, s: Stats) -> None:
        setattr(self, f"{phase}_ms", round(s.median, 4))
        setattr(self, f"{phase}_iqr_ms", [round(s.q1, 4), round(s.q3, 4)])
        setattr(self, f"{phase}_range_ms", [round(s.min, 4), round(s.max, 4)])

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        problem: dict[str, Any] = out.pop("problem")
        if clash := set(problem) & set(out):
            raise ValueError(f"problem fields {sorted(clash)} are the record's own")
        return out | problem


RECORD_KEYS = tuple(f.name for f in dataclasses.fields(Record) if f.name != "problem")


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
    """HEAD's short hash, with ``-dirty`` where tracked files differ from it (a copied tree
    whose ``.git`` is another commit's, or uncommitted edits): a record names what it ran."""

    def git(*args: str) -> subprocess.CompletedProcess[str] | None:
        try:
            return subprocess.run(
                ["git", *args],
                cwd=Path(__file__).resolve().parents[2],
                capture_output=True,
                text=True,
                timeout=10,
            )
        except (OSError, subprocess.SubprocessError):
            return None

    head = git("rev-parse", "--short=12", "HEAD")
    if head is None or head.returncode != 0 or not head.stdout.strip():
        return None
    diff = git("diff", "--quiet", "HEAD", "--")
    return head.stdout.strip() + ("-dirty" if diff is None or diff.returncode != 0 else "")


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
    try:
        tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # left only where the write or the rename failed


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
