"""Timing calls: CUDA events around each call (a host clock on the CPU), the device idle
before it, warm-up calls excluded; median, quartiles and range over the timed calls. When one
input set is smaller than twice the L2 cache, the calls rotate among several sets generated up
front, so that no call finds its inputs in the cache."""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

MAX_INPUT_SETS = 8

Timer = Callable[[Callable[[], object]], float]
"""Runs a callable once and returns its time in ms."""


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
