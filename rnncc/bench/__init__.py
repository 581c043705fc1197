"""``rnncc bench``: time a compiled cell's forward and forward + backward on rnncc's backends,
cuDNN and the PyTorch loop, in one process; print a table or write JSON. Third-party
baselines, CUDA-graph replays, plots and the suite of sizes (``benchmarks/``) are not here.
``timing`` (how calls are timed), ``workloads`` (what each system runs), ``records`` (the
results and their table and JSON), ``command`` (running the systems, the CLI)."""

from __future__ import annotations

from rnncc.bench.command import (
    DEFAULT_SYSTEMS,
    Settings,
    parse_systems,
    register,
    run,
    run_system,
    summary,
    time_workload,
)
from rnncc.bench.records import (
    RECORD_KEYS,
    Record,
    fmt_ms,
    format_table,
    gpu_slug,
    machine_info,
    write_results,
)
from rnncc.bench.timing import MAX_INPUT_SETS, Stats, host_timer, input_sets, measure
from rnncc.bench.workloads import (
    BASELINES,
    Case,
    cell_workload,
    cudnn_workload,
    detect_baseline,
    module_workload,
)

__all__ = [
    "BASELINES",
    "DEFAULT_SYSTEMS",
    "MAX_INPUT_SETS",
    "RECORD_KEYS",
    "Case",
    "Record",
    "Settings",
    "Stats",
    "cell_workload",
    "cudnn_workload",
    "detect_baseline",
    "fmt_ms",
    "format_table",
    "gpu_slug",
    "host_timer",
    "input_sets",
    "machine_info",
    "measure",
    "module_workload",
    "parse_systems",
    "register",
    "run",
    "run_system",
    "summary",
    "time_workload",
    "write_results",
]
