"""Shared by the ablation tools (``ablate_block_forward.py``, ``ablate_block_backward.py``): a
cell's generated fused source with text patches applied inside one kernel, the variants built
in parallel, and a variant's kernel time from the torch profiler.

A patch is ``(old, new)``: the first ``old`` after the kernel's signature becomes ``new``.
Patched variants compute wrong values: timing only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch
from torch.profiler import ProfilerActivity, profile

import rnncc
from rnncc.runtime import stepwise as sw
from rnncc.testing import random_inputs

Patch = tuple[str, str]


def patched_sources(
    cell: rnncc.CompiledCell, D: int, kernel: str, variants: dict[str, Sequence[Patch]]
) -> dict[str, object]:
    """Each variant's generated source: its patches applied after ``kernel`` (a signature)."""
    src = sw.generate_fused(cell.ir, cell.backward_ir, D)
    i = src.text.index(kernel)
    out = {}
    for name, patches in variants.items():
        head, tail = src.text[:i], src.text[i:]
        for old, new in patches:
            assert old in tail, f"{name}: not in the kernel: {old}"
            tail = tail.replace(old, new, 1)
        out[name] = dataclasses.replace(src, text=head + tail)
    return out


def build_all(cell: rnncc.CompiledCell, D: int, sources: dict[str, object]) -> str:
    """Build every variant's library at once (16 jobs); returns the device's arch."""
    arch = sw.arch_of(0)

    def build(name: str) -> None:
        src = sources[name]
        sw.build_library(
            f"rnncc_{cell.name}_fused_d{D}",
            {src.filename: src.text},  # type: ignore[attr-defined]
            arch=arch,
            headers=sw._header_paths(),
        )

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(build, sources))
    return arch


def variant_ops(cell: rnncc.CompiledCell, D: int, arch: str, source: object) -> sw.FusedOps:
    """The fused ops of one variant (its library found in the cache by content)."""
    original = sw.generate_fused
    sw.generate_fused = lambda c, b, d: source  # type: ignore[assignment]
    try:
        return sw.FusedOps(cell.ir, cell.backward_ir, arch, D)
    finally:
        sw.generate_fused = original


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
