"""Stage dumps: with ``RNNCC_DUMP_DIR`` set, every compiler stage's output is written there.

Input: a stage name, the cell's name and the stage's text. Output: the file
``$RNNCC_DUMP_DIR/<cell>.<stage>`` (e.g. ``lstm.ast.txt``, ``lstm.ir.rnn``,
``lstm.backward.rnn``, ``lstm.plan.b16.1x768.bf16.txt``, ``lstm.stepwise.cu``), written
atomically; nothing when the variable is unset. Like Triton's dumps: for reading what the
compiler did, not for loading back.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rnncc.tiling.plan import Plan

from rnncc.config import ConfigError, get_dump_dir


def dump(cell: str, stage: str, text: str) -> None:
    """Write one stage's output when dumping is on; see the module docstring. A folder that
    cannot be written raises ``ConfigError`` naming the variable."""
    directory = get_dump_dir()
    if directory is None:
        return
    path = directory / f"{cell}.{stage}"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as err:
        reason = "not a folder" if isinstance(err, FileExistsError) else err.strerror or str(err)
        raise ConfigError(
            f"RNNCC_DUMP_DIR={str(directory)!r}: cannot write the stage dumps there ({reason})"
        ) from None


def dump_plan(cell: str, plan: Plan) -> None:
    """The plan a call or ``rnncc plan`` solved, as ``plan.explain()`` prints it, in a file
    named after the problem: ``<cell>.plan.b<B>.<heads>x<head dim>.<dtype>`` and
    ``.timeline`` (per-row lengths or reversed heads), ``.density<d>`` (a sparse R)."""
    if get_dump_dir() is None:  # explain() is not free, and a call plans on first use
        return
    p = plan.problem
    name = f"plan.b{p.batch}.{p.heads}x{p.head_dim}.{p.dtype}"
    name += ".timeline" if p.timeline else ""
    name += f".density{p.density:g}" if p.density < 1 else ""
    dump(cell, f"{name}.txt", plan.explain() + "\n")
