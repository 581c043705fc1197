"""Grid sparse: the fused 16-bit kernels for a sparse R (a mask), its non-zeros kept on chip.

A head's units are split over blocks of ``units`` units (as few per block as fill the SMs),
each with ``rows`` batch rows (4 or 8). A block keeps the non-zeros of its strips of R in
shared memory for the whole sequence, 32 bits each (the 16-bit value and its column): the
forward's strip is R's rows of the block's units (all gates), the backward's R's columns of
them (all gate rows). The kernel finds them itself before the first step (zeros of R are
skipped, so a mask's dropped entries cost nothing), so the plan needs only the kept fraction
of the fullest strip (``Problem.density``, from the mask) to know they fit. A step stages h
(or dg, whole or a gate's rows at a time; either in halves where the entries fit only beside
half) in shared memory and runs the entries on the CUDA cores
(fp32 sums), a warp per even share of them; h and dg go through an exchange buffer behind a
counter per (head, batch chunk), as on ``grid_mma``. Every block of a launch is resident at
once (a cooperative launch); (head, chunk) pairs beyond the SMs run in further launches.
Full-length sequences in one direction only (``lengths=`` and ``reverse=`` take the dense
variants).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rnncc.variants.base import Constraint, Cost, KernelLaunch, Launch, Point, Variant, cdiv
from rnncc.variants.grid_mma import LIBRARY_SMEM, smem_limit

if TYPE_CHECKING:
    from rnncc.codegen.source import GeneratedSource
    from rnncc.ir.cell import BackwardCell, Cell
    from rnncc.tiling.hardware import HardwareCaps
    from rnncc.tiling.problem import Problem

#: A block's threads: 16 warps share its entries.
THREADS = 512
#: SMs of the device a library is built for when the plan names none (an H100 SXM's).
DEFAULT_SMS = 132
#: The cost model's fits to the kernels' times on an H100 (T = 1024, B = 4, LSTM and GRU at
#: 2304-4032 units, 10-32 %; benchmarks/results/sparse-h100-*.json), µs a step: the forward's
#: part beyond its stages, slots and entries; a slot's end (a warp's reduction), paid again
#: per extra chunk at SLOT_REPEAT; an entry of a block's fullest strip (about 15 instructions a 32,
#: issue-bound); the backward's part beyond its stages and entries; an extra chunk of the
#: backward (a stage, two barriers, the slots' ends), fixed and per unit of the head.
FORWARD_STEP_US = 0.21
SLOT_US = 0.048
SLOT_REPEAT = 0.75
ENTRY_US = 0.0744e-3
BACKWARD_STEP_US = 3.5
BACKWARD_CHUNK_US = 0.6
BACKWARD_CHUNK_US_PER_UNIT = 0.3e-3


def block_units(head_dim: int, sm_count: int) -> int:
    """Units of a block: the fewest (an even number) that put a head on at most ``sm_count``
    blocks, so that each block's strips are as small as the chip allows."""
    return max(2, 2 * cdiv(head_dim, 2 * sm_count))


def rows(p: Problem) -> int:
    """Batch rows of a block: 4 for batches of up to 4, else 8."""
    return 4 if p.batch <= 4 else 8


def _sms(caps: HardwareCaps | None) -> int:
    return DEFAULT_SMS if caps is None else caps.sm_count


def backward_gates(p: Problem, units: int, smem: int = LIBRARY_SMEM) -> int:
    """Gates of dg the backward stages at once: all of them where their rows fit beside the
    fullest strip's entries (one stage and two barriers a step), else one at a time."""
    gr = max(p.gates_r, 1)
    return gr if strip_entries(p, units) <= capacity(p, units, True, smem, gr) else 1


def operand_split(p: Problem, units: int, backward: bool, smem: int = LIBRARY_SMEM) -> int:
    """1, or 2 where the fullest strip's entries fit only beside half of the operand (h, or a
    gate's rows of dg), staged a half at a time (a stage and two barriers more a step, per
    half)."""
    # (a backward that gets here stages dg a gate at a time: all of it at once did not fit)
    gates = backward_gates(p, units, smem) if backward else 1
    if strip_entries(p, units) <= capacity(p, units, backward, smem, gates):
        return 1
    return 2 if p.head_dim % 2 == 0 else 1


def _fixed_bytes(p: Problem, units: int, backward: bool, gates: int = 1, split: int = 1) -> int:
    """Shared memory besides the entries (the kernel's ``Shape``): the operand's chunk (h, or
    ``gates`` gates' rows of dg, or 1 / ``split`` of either: columns x rows, 16-bit), the
    slots' float sums, the entries' start per (chunk, slot), each warp's first slot per
    chunk, and the backward's biases and params of the block's units."""
    gr = max(p.gates_r, 1)
    slots, chunks = (units, gr // gates) if backward else (gr * units, 1)
    chunks *= split
    cols = (gates * p.head_dim if backward else p.head_dim) // split
    nb = rows(p)
    fixed = 2 * cols * nb + 4 * slots * nb + 4 * (chunks * slots + 1)
    fixed += 4 * chunks * (THREADS // 32)
    if backward:
        fixed += 4 * (max(p.gates_b, 1) + max(p.n_params, 1)) * units
    return fixed


def capacity(
    p: Problem,
    units: int,
    backward: bool,
    smem: int = LIBRARY_SMEM,
    gates: int = 1,
    split: int = 1,
) -> int:
    """Entries a block holds in ``smem`` bytes beside the rest (``gates``: of dg staged at once;
    ``split``: the operand in that many parts; a multiple of 4, so the operand after them is
    16-byte aligned)."""
    return max(0, (smem - _fixed_bytes(p, units, backward, gates, split)) // 16 * 4)


def strip_entries(p: Problem, units: int) -> int:
    """The entries of the fullest strip: its kept fraction of ``gates_r × units × head_dim``
    (a forward strip's rows and a backward strip's columns are as many)."""
    return math.ceil(p.density * max(p.gates_r, 1) * units * p.head_dim)


def exchange_buffer_words(p: Problem) -> int:
    """The exchange: 16-bit values [2][heads][chunks][gates_r × head_dim][rows], then a 32-bit
    counter per (head, chunk)."""
    chunks = cdiv(p.batch, rows(p))
    values = 2 * p.heads * chunks * max(p.gates_r, 1) * p.head_dim * rows(p)
    return values // 2 + p.heads * chunks


# -- constraints ---------------------------------------------------------------------------


def sparse_r(p: Problem, caps: HardwareCaps) -> bool:
    return p.density < 1.0 and p.gates_r > 0


def full_length_only(p: Problem, caps: HardwareCaps) -> bool:
    return not p.timeline


def entries_fit_shared_memory(p: Problem, caps: HardwareCaps) -> bool:
    return all(need <= room for need, room in _sides(p, caps))


def _sides(p: Problem, caps: HardwareCaps) -> list[tuple[int, int]]:
    """(entries, capacity) of the forward and the backward, each with the operand split as
    the build would."""
    units, limit = block_units(p.head_dim, caps.sm_count), smem_limit(caps)
    need = strip_entries(p, units)
    return [
        (need, capacity(p, units, b, limit, split=operand_split(p, units, b, limit)))
        for b in (False, True)
    ]


def cell_threads(p: Problem, caps: HardwareCaps) -> bool:
    return block_units(p.head_dim, caps.sm_count) * rows(p) // 2 <= THREADS


def _entries_usage(p: Problem, caps: HardwareCaps, point: Point) -> tuple[float, float]:
    return max(_sides(p, caps), key=lambda side: side[0] / max(side[1], 1))  # the fuller one


class GridSparse(Variant):
    name = "grid_sparse"
    summary = (
        "CUDA-core grid tier for a sparse R: each block keeps the non-zeros of its units' rows "
        "and columns of R in shared memory for the whole sequence"
    )
    dtypes = ("fp16", "bf16")
    host = "fused"
    constraints = (
        Constraint(
            "sparse_r",
            "only for calls with a mask (R's kept fraction below 1)",
            sparse_r,
        ),
        Constraint(
            "full_length_only",
            "full-length sequences in one direction (no lengths=, no reverse=)",
            full_length_only,
        ),
        Constraint(
            "entries_fit_shared_memory",
            "the non-zeros of a block's fullest strip of R (4 bytes each) fit its shared "
            "memory beside h or a gate's rows of dg",
            entries_fit_shared_memory,
            usage=_entries_usage,
        ),
        Constraint(
            "cell_threads",
            f"a block's units x its batch rows / 2 cell threads fit its {THREADS} threads",
            cell_threads,
        ),
    )

    def build(self, problem: Problem, caps: HardwareCaps | None = None) -> dict[str, Any]:
        p = problem
        units = block_units(p.head_dim, _sms(caps))
        smem = LIBRARY_SMEM if caps is None else smem_limit(caps)
        gates = backward_gates(p, units, smem)
        fs, bs = operand_split(p, units, False, smem), operand_split(p, units, True, smem)
        fw, bw = capacity(p, units, False, smem, 1, fs), capacity(p, units, True, smem, gates, bs)
        return {
            "variant": self.name,
            "D": p.head_dim,
            "units": units,
            "rows": rows(p),
            "threads": THREADS,
            "fw_entries": fw,
            "bw_entries": bw,
            "fw_smem": 4 * fw + _fixed_bytes(p, units, False, 1, fs),
            "bw_smem": 4 * bw + _fixed_bytes(p, units, True, gates, bs),
            "bw_gates": gates,
            "fw_split": fs,
            "bw_split": bs,
            "exchange_words": max(p.gates_r, 1) * p.head_dim,
        }

    def _split(self, problem: Problem, caps: HardwareCaps) -> tuple[int, int, int]:
        """(heads per launch, chunks per launch, launches), one block per SM at most."""
        p = problem
        blocks = cdiv(p.head_dim, block_units(p.head_dim, caps.sm_count))
        chunks = cdiv(p.batch, rows(p))
        if blocks * chunks <= caps.sm_count:
            heads, per = max(1, min(p.heads, caps.sm_count // (blocks * chunks))), chunks
        else:
            heads, per = 1, max(1, caps.sm_count // blocks)
        return heads, per, cdiv(p.heads, heads) * cdiv(chunks, per)

    def launch(self, problem: Problem, caps: HardwareCaps, point: Point) -> Launch:
        b = self.build(problem, caps)
        heads, chunks, launches = self._split(problem, caps)
        grid = (cdiv(problem.head_dim, b["units"]), heads, chunks)
        return Launch(
            KernelLaunch(0, THREADS, b["fw_smem"], grid, launches),
            KernelLaunch(0, THREADS, b["bw_smem"], grid, launches),
            b["exchange_words"],
            exchange_buffer_words(problem),
        )

    def cost(self, problem: Problem, caps: HardwareCaps, point: Point) -> Cost:
        p = problem
        units, nb, limit = block_units(p.head_dim, caps.sm_count), rows(p), smem_limit(caps)
        gr = max(p.gates_r, 1)
        entries_us = strip_entries(p, units) * ENTRY_US
        l2 = caps.l2_gbs_per_sm * 1e3  # bytes per µs into one SM after the wait
        halves = operand_split(p, units, False, limit)
        terms: tuple[tuple[str, float], ...] = (
            ("step", FORWARD_STEP_US),
            ("gather", p.head_dim * nb * p.dtype_bytes / l2),
            ("slots", SLOT_US * gr * units * (1 + SLOT_REPEAT * (halves - 1))),
            ("entries", entries_us),
        )
        unit = sum(us for _, us in terms)
        chunks = gr // backward_gates(p, units, limit) * operand_split(p, units, True, limit)
        per_chunk = BACKWARD_CHUNK_US + BACKWARD_CHUNK_US_PER_UNIT * p.head_dim
        backward = (
            BACKWARD_STEP_US
            + gr * p.head_dim * nb * p.dtype_bytes / l2
            + entries_us
            + (chunks - 1) * per_chunk
        )
        launches = self._split(p, caps)[2]
        return Cost(terms, launches, unit * launches, backward * launches)

    def render(self, cell: Cell, bwd: BackwardCell, build: Any) -> GeneratedSource:
        from rnncc.codegen.source import render_fused

        traits = [
            ("int", "kD", build["D"]),
            ("int", "kU", build["units"]),
            ("int", "kNB", build["rows"]),
            ("int", "kSparseThreads", build["threads"]),
            ("int", "kFwEntries", build["fw_entries"]),
            ("int", "kBwEntries", build["bw_entries"]),
            ("int", "kFwSmem", build["fw_smem"]),
            ("int", "kBwSmem", build["bw_smem"]),
            ("int", "kBwGates", build["bw_gates"]),
            ("int", "kFwSplit", build["fw_split"]),
            ("int", "kBwSplit", build["bw_split"]),
        ]
        return render_fused(cell, bwd, self.name, build, traits, fast=True)
