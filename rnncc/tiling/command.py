"""The ``rnncc plan`` subcommand: a cell file and sizes → the tiling plan, explained.

    rnncc plan CELL.rnn [--cell NAME] --hidden 768 [--heads 12] [--batch 16] [--dtype bf16]
               [--arch sm_90] [--json]

Input: the parsed arguments. Output: ``plan.explain()`` (or the plan as JSON) on stdout and
exit status 0; a ``TilingError`` (no plan, unknown arch, no GPU and no ``--arch``) or bad
sizes print one message to stderr and return 1. The cell is loaded with
``rnncc.load(file, cell=name).ir``; the lead wires ``register`` into ``rnncc/cli.py``.

Non-goals: building or running anything; the cell's own errors (``rnncc.load`` reports them).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any

from rnncc.errors import TilingError
from rnncc.tiling.hardware import HardwareCaps, caps_for_arch, caps_for_device
from rnncc.tiling.plan import TilingPlan
from rnncc.tiling.problem import DTYPES, Problem
from rnncc.tiling.solve import solve


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``plan`` to an argparse subparsers object; its ``func`` default is ``run``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "plan",
        help="print the tiling plan of the fused kernel for a cell and sizes",
        description="Solve the tiling model for a cell at the given sizes and explain the plan.",
    )
    parser.add_argument("file", help="the .rnn file")
    parser.add_argument("--cell", default=None, help="the cell's name if the file holds several")
    parser.add_argument("--hidden", type=int, required=True, help="hidden size = heads × D")
    parser.add_argument("--heads", type=int, default=1, help="number of heads (default 1)")
    parser.add_argument("--batch", type=int, default=16, help="batch size (default 16)")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES), help="storage dtype")
    parser.add_argument(
        "--arch",
        default=None,
        help="target GPU: sm_90, h100, h100-pcie, h200, a100, l40s, rtx4090, ... "
        "(default: the current CUDA device)",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.set_defaults(func=run)
    return parser


def _caps(arch: str | None) -> HardwareCaps:
    return caps_for_arch(arch) if arch else caps_for_device()


def plan_for_sizes(
    cell: Any, *, hidden: int, heads: int, batch: int, dtype: str, arch: str | None
) -> TilingPlan:
    """The best plan for ``cell`` (the IR) at these sizes on ``arch`` (default: this GPU);
    raises ``ValueError`` for sizes that do not split into heads, ``TilingError`` when
    nothing fits."""
    if heads < 1 or hidden < 1 or hidden % heads:
        raise ValueError(f"--hidden {hidden} is not a positive multiple of --heads {heads}")
    caps = _caps(arch)
    problem = Problem.from_cell(
        cell, heads=heads, head_dim=hidden // heads, batch=batch, dtype=dtype
    )
    return solve(problem, caps)


def run(args: argparse.Namespace) -> int:
    """Print the plan; 0 on success, 1 (message on stderr) when there is none."""
    try:
        rnncc = importlib.import_module("rnncc")
        cell = rnncc.load(args.file, cell=args.cell).ir
        plan = plan_for_sizes(
            cell,
            hidden=args.hidden,
            heads=args.heads,
            batch=args.batch,
            dtype=args.dtype,
            arch=args.arch,
        )
    except (TilingError, ValueError) as err:
        print(f"rnncc plan: error: {err}", file=sys.stderr)
        return 1
    if getattr(args, "json", False):
        print(json.dumps(plan.as_dict(), indent=2))
    else:
        print(plan.explain())
    return 0
