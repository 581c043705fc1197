"""Shared by the ablation tools (``ablate_block_forward.py``, ``ablate_block_backward.py``,
``grid_timeline.py``): a kernel variant's generated source, its skeleton header inlined, with
text patches applied inside one kernel, the patched libraries built in parallel, their ops, and a kernel's time from the
torch profiler.

A patch is ``(old, new)``: the first ``old`` after the kernel's signature becomes ``new``;
or ``(anchor, old, new)``: the first ``old`` after ``anchor`` (the cell's hooks: the
generated struct ``Cell``, after the skeleton). Skeleton bodies are members of the header's
struct ``Kernels``: ``indented`` moves patches written for a free function two columns on.
Patched sources compute wrong values: timing only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

import rnncc
from rnncc.codegen.source import GeneratedSource
from rnncc.config import get_config
from rnncc.resources import templates_dir
from rnncc.runtime.build import build_library
from rnncc.runtime.kernels import KernelOps, arch_of
from rnncc.testing import random_inputs
from rnncc.tiling import Plan, Problem, caps_for_device, solve
from rnncc.variants import BY_NAME

Patch = tuple[str, str] | tuple[str, str, str]


def indented(patches: Sequence[tuple[str, str]]) -> list[Patch]:
    """``patches`` with every line that is not blank or a preprocessor line moved two columns on."""

    def indent(text: str) -> str:
        return "\n".join(
            "  " + line if line.strip() and not line.startswith("#") else line
            for line in text.split("\n")
        )

    return [(indent(old), indent(new)) for old, new in patches]


def plan_for(cell: rnncc.CompiledCell, variant: str, NH: int, D: int, B: int) -> Plan:
    """``variant``'s best point for the cell at these sizes (bf16) on the current device."""
    problem = Problem.from_cell(cell.ir, heads=NH, head_dim=D, batch=B, dtype="bf16")
    return solve(problem, caps_for_device(torch.cuda.current_device()), [BY_NAME[variant]])


def patched_sources(
    cell: rnncc.CompiledCell,
    build: Mapping[str, Any],
    kernel: str,
    ablations: dict[str, Sequence[Patch]],
) -> dict[str, GeneratedSource]:
    """The source of the variant library ``build`` describes, once per ablation, its patches
    applied after ``kernel`` (a signature, or any text before the patched code)."""
    src = BY_NAME[build["variant"]].render(cell.ir, cell.backward_ir, build)
    skeleton = f"{build['variant']}.cuh"
    include = f'#include "{skeleton}"\n'
    src = dataclasses.replace(
        src, text=src.text.replace(include, (templates_dir() / skeleton).read_text())
    )
    out = {}
    for name, patches in ablations.items():
        text = src.text
        for patch in patches:
            anchor, old, new = patch if len(patch) == 3 else (kernel, *patch)
            i = text.index(anchor)
            assert old in text[i:], f"{name}: not after {anchor!r}: {old}"
            text = text[:i] + text[i:].replace(old, new, 1)
        out[name] = dataclasses.replace(src, text=text)
    return out


def build_source(
    cell: rnncc.CompiledCell, build: Mapping[str, Any], source: GeneratedSource, arch: str
) -> Path:
    """Build ``source`` as the library of ``build`` (the name, headers and record that
    ``rnncc.runtime.kernels.build_kernels`` gives it), so that its ops find it in the cache."""
    variant = BY_NAME[build["variant"]]
    return build_library(
        variant.library_name(cell.name, build),
        {source.filename: source.text},
        arch=arch,
        headers=[templates_dir() / h for h in source.headers],
        description=f"{cell.name} {variant.name} kernels, patched ({arch})",
        plan=dict(build),
    )


def build_all(
    cell: rnncc.CompiledCell, build: Mapping[str, Any], sources: dict[str, GeneratedSource]
) -> str:
    """Build every patched library at once (``MAX_JOBS`` builds, else 16); returns the arch."""
    arch = arch_of(torch.cuda.current_device())
    with ThreadPoolExecutor(get_config().max_jobs or 16) as pool:
        list(pool.map(lambda src: build_source(cell, build, src, arch), sources.values()))
    return arch


def patched_ops(
    cell: rnncc.CompiledCell, build: Mapping[str, Any], arch: str, source: GeneratedSource
) -> KernelOps:
    """The ops of one patched library (built by ``build_all``: found in the cache by content).
    The variant renders ``source`` while they are made; not thread-safe."""
    variant = BY_NAME[build["variant"]]
    variant.render = lambda c, b, bld: source  # type: ignore[method-assign]
    try:
        return KernelOps(cell.ir, cell.backward_ir, build, arch)
    finally:
        del variant.render  # the class's render again


def inputs(cell: rnncc.CompiledCell, B: int, T: int, NH: int, D: int) -> list:
    """Random bf16 inputs on the GPU, in the forward op's order."""
    x = random_inputs(cell.ir, B, T, NH, D, seed=0)
    order = ("Wx", "R", "b", "states", "params")
    return [None if x[k] is None else x[k].to("cuda", torch.bfloat16) for k in order]


def kernel_us(run: Callable[[], None], key: str, calls: int = 5) -> float:
    """Mean device time (µs) of the kernels whose name holds ``key`` over ``calls`` runs, after
    three warm-up runs."""
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    ev = [e for e in prof.key_averages() if key in e.key]
    return ev[0].device_time_total / ev[0].count
