"""Grid sparse: the fused 16-bit kernels for a sparse R (a mask), its non-zeros kept on chip.

A head's units are split over blocks of ``units`` units (as few per block as fill the SMs),
each with ``rows`` batch rows (4 or 8). A block keeps the non-zeros of its strips of R on chip
for the whole sequence, 32 bits each (the 16-bit value and its column): in shared memory, and
where that alone cannot hold them, part in its lanes' registers as well (``REG_THREADS``
threads of ``REG_ENTRIES`` entries each). The forward's strip is R's rows of the block's units
(all gates), the backward's R's columns of them (all gate rows). The kernel finds them itself
before the first step (zeros of R are skipped, so a mask's dropped entries cost nothing) and
cuts each slot's into pieces that a lane runs whole, 32 pieces a warp's round (``pieces``); a
round's end stores each lane's sums as its piece's, and the block adds each slot's pieces up
after the chunk (no atomics: a step's sums are the same whatever the warps' timing). The
plan counts the shared memory that takes from the mask's entries per block, chunk and slot
(``Problem.slot_counts``) exactly, or estimates it from the kept fraction of the mask's fullest
strip (``Problem.density``) and of its fullest half strip (``Problem.piece_density``). A step
stages h (or dg, whole or a gate's rows at a time; either in halves where the entries fit only
beside half) in shared memory and runs the entries on the CUDA cores (fp32 sums); h and dg go
through an exchange buffer behind a counter per (head, batch chunk), as on ``grid_mma``. Every
block of a launch is resident at once (a cooperative launch); (head, chunk) pairs beyond the
SMs run in further launches. Full-length sequences in one direction only
(``lengths=`` and ``reverse=`` take the dense variants).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rnncc.variants import pieces
from rnncc.variants.base import Constraint, Cost, KernelLaunch, Launch, Point, Variant, cdiv
from rnncc.variants.grid_mma import LIBRARY_SMEM, smem_limit

if TYPE_CHECKING:
    from rnncc.codegen.source import GeneratedSource
    from rnncc.ir.cell import BackwardCell, Cell
    from rnncc.tiling.hardware import HardwareCaps
    from rnncc.tiling.problem import Problem

#: A block's threads where shared memory holds its entries: 16 warps share them.
THREADS = 512
#: A block's threads where its lanes' registers hold part of its entries as well (8 warps,
#: up to 255 registers each), and the entries each thread holds there at 4 and at 8 batch rows,
#: forward and backward (ptxas keeps every example's kernels under the register limit, no
#: spills, at these: 8 more in the sLSTM's backward at 5280 units spilled).
REG_THREADS = 256
REG_ENTRIES = {(4, False): 152, (4, True): 144, (8, False): 128, (8, True): 128}
#: Pieces a slot's entries are cut into, at least, over a step's chunks (``rounds``): LSTM and
#: GRU at 2304-5280 units, 10-60 %, on an H100 (benchmarks/results/sparse-pieces-h100-2026-11-27.txt).
PIECES_PER_SLOT = 6
#: The pieces' padding a plan without a mask's slot counts allows for (rounds as long as their
#: longest piece): 0.2-1 % in the layouts of random masks at 2304 and 5280 units, 10-45 %.
PIECE_PADDING = 0.02
#: SMs of the device a library is built for when the plan names none (an H100 SXM's).
DEFAULT_SMS = 132
#: The cost model, µs a step, fit to the kernels' times on an H100 (T = 1024, random masks: the
#: LSTM at 2304 units 10-45 %, at 3840 and 5280 units 10 %, the GRU at 2304 units 30 % and, at
#: B = 16, 30 and 60 %; benchmarks/results/sparse-parts-h100-2026-11-27.txt; each within 12 %,
#: tests/variants/test_sparse_variant.py): the forward's part beyond its stage, slots and
#: entries; a slot's sums (its pieces' stores and their fold); an entry of a block's fullest
#: strip (about 13 instructions a 32, issue-bound), ROWS8_ENTRY times that at 8 batch rows (a
#: 16-byte load and 8 adds); the backward's part beyond its stages and entries; an extra chunk
#: of the backward, fixed and per unit of the head. The forward's halves cost nothing the fit
#: could see.
FORWARD_STEP_US = 0.75
SLOT_US = 0.019
ENTRY_US = 0.1e-3
ROWS8_ENTRY = 1.16
BACKWARD_STEP_US = 2.74
BACKWARD_CHUNK_US = 0.35
BACKWARD_CHUNK_US_PER_UNIT = 0.18e-3
#: A layout at REG_THREADS threads (8 warps a block: less latency hidden) against the
#: shared-memory model above, forward and backward: with entries in registers (the same fit),
#: and the forward without (all its entries in shared memory, read by half the warps: the LSTM
#: at 2304 units and a 32 % strip, 9.4-9.9 ms where the model above gives 7.9 µs a step).
REG_LAYOUT_FW = 1.13
REG_LAYOUT_BW = 1.07
SHARED_256_FW = 1.22


def block_units(head_dim: int, sm_count: int) -> int:
    """Units of a block: the fewest (an even number) that put a head on at most ``sm_count``
    blocks, so that each block's strips are as small as the chip allows."""
    return max(2, 2 * cdiv(head_dim, 2 * sm_count))


def rows(p: Problem) -> int:
    """Batch rows of a block: 4 for batches of up to 4, else 8."""
    return 4 if p.batch <= 4 else 8


def _sms(caps: HardwareCaps | None) -> int:
    return DEFAULT_SMS if caps is None else caps.sm_count


@dataclass(frozen=True)
class Side:
    """How the forward's or the backward's kernel holds a block's entries: the operand in
    ``chunks`` staged one after another (the backward's dg ``gates`` gates' rows at a time; either
    in ``split`` parts), each warp's first ``reg_steps`` steps of 32 entries of every chunk in its
    lanes' registers, the rest (up to ``entries``) in shared memory."""

    threads: int
    gates: int
    split: int
    reg_steps: int
    rounds: int
    entries: int
    smem: int


def _chunks(p: Problem, backward: bool, gates: int, split: int) -> int:
    return (max(p.gates_r, 1) // gates if backward else 1) * split


def _slots(p: Problem, units: int, backward: bool) -> int:
    return units if backward else max(p.gates_r, 1) * units


def rounds(p: Problem, units: int, backward: bool, threads: int, chunks: int) -> int:
    """Rounds of 32 pieces a warp runs per chunk: the fewest that give each slot
    ``PIECES_PER_SLOT`` pieces or more over a step's chunks. A slot's pieces are about
    ``1 / pieces`` of its entries long, so with few a slot the rounds' lengths differ and some
    warp runs longer than the rest; with many they are short, and a lane's entries spread over
    fewer bank groups at a time (more wavefronts a step)."""
    return cdiv(PIECES_PER_SLOT * _slots(p, units, backward), chunks * threads)


def _fixed_bytes(
    p: Problem, units: int, backward: bool, gates: int, split: int, threads: int
) -> int:
    """Shared memory besides the entries (the kernel's ``Shape``): the pieces' float sums (a
    chunk's), the operand's chunk (h, or ``gates`` gates' rows of dg, or 1 / ``split`` of
    either: columns x rows, 16-bit), the slots' float sums, the entries' start per (chunk,
    slot), each (chunk, warp, round)'s end, each (chunk, warp)'s first shared entry, and the
    backward's biases and params of the block's units."""
    slots = _slots(p, units, backward)
    chunks = _chunks(p, backward, gates, split)
    cols = (gates * p.head_dim if backward else p.head_dim) // split
    nb, warps, r = rows(p), threads // 32, rounds(p, units, backward, threads, chunks)
    fixed = 4 * 32 * warps * r * nb + 2 * cols * nb + 4 * slots * nb + 4 * (chunks * slots + 1)
    fixed += 4 * chunks * warps * r + 4 * chunks * warps
    if backward:
        fixed += 4 * (max(p.gates_b, 1) + max(p.n_params, 1)) * units
    return fixed


def capacity(
    p: Problem, units: int, backward: bool, smem: int, gates: int, split: int, threads: int
) -> int:
    """Entries a block holds in ``smem`` bytes of shared memory beside the rest (a multiple of
    4, so the operand after them is 16-byte aligned)."""
    return max(0, (smem - _fixed_bytes(p, units, backward, gates, split, threads)) // 16 * 4)


def strip_entries(p: Problem, units: int) -> int:
    """The entries of the fullest strip: its kept fraction of ``gates_r × units × head_dim``
    (a forward strip's rows and a backward strip's columns are as many)."""
    return math.ceil(p.density * max(p.gates_r, 1) * units * p.head_dim)


def shared_entries(
    p: Problem, units: int, backward: bool, gates: int, split: int, threads: int, reg_steps: int
) -> int:
    """The most entries a block keeps in shared memory: each chunk's, laid out in rounds of
    pieces, beyond what its warps hold in registers. Of a mask's slot counts exactly
    (``pieces.shared_entries``: what the kernel's prologue will lay out); else an estimate: a
    chunk's entries are at most ``Problem.chunk_density`` of its positions (the mask's fullest
    piece: a chunk is one piece or several), and its rounds pad them by ``PIECE_PADDING`` (a
    few per cent at the sizes that fill shared memory; far more where pieces hold an entry or
    two, where shared memory has room to spare)."""
    chunks, warps = _chunks(p, backward, gates, split), threads // 32
    r = rounds(p, units, backward, threads, chunks)
    if p.slot_counts is not None and p.slot_counts.units == units:
        counts = p.slot_counts.chunks(backward, gates, split)
        return pieces.shared_entries(counts, warps, r, reg_steps)
    positions = (gates if backward else max(p.gates_r, 1)) * units * p.head_dim // split
    padded = math.ceil(math.ceil(p.chunk_density * positions) * (1 + PIECE_PADDING))
    return chunks * max(0, padded - 32 * warps * reg_steps)


def _side(
    p: Problem,
    units: int,
    backward: bool,
    smem: int,
    threads: int,
    gates: int,
    split: int,
    steps: int,
) -> Side:
    """The side with these chunks and register steps, its shared memory filled with entries."""
    room = capacity(p, units, backward, smem, gates, split, threads)
    fixed = _fixed_bytes(p, units, backward, gates, split, threads)
    r = rounds(p, units, backward, threads, _chunks(p, backward, gates, split))
    return Side(threads, gates, split, steps, r, room, 4 * room + fixed)


def _splits(p: Problem) -> tuple[int, ...]:
    """The operand whole, or in halves (an even head dim)."""
    return (1, 2) if p.head_dim % 2 == 0 else (1,)


def side(p: Problem, units: int, backward: bool, smem: int, threads: int) -> Side | None:
    """The first of these that holds the fullest strip at ``threads`` threads (None: none
    does): the backward's dg staged whole, then a gate at a time; the operand whole, then in
    halves (a stage and two barriers more a step); shared memory alone, then with the lanes'
    registers (``REG_ENTRIES`` a thread, at ``REG_THREADS`` threads)."""
    gr = max(p.gates_r, 1)
    regs = REG_ENTRIES[rows(p), backward] if threads == REG_THREADS else 0
    options = (
        [(gr, 1)] + [(1, s) for s in _splits(p) if gr > 1 or s > 1]
        if backward
        else [(1, s) for s in _splits(p)]
    )
    for use_regs in (False, True) if regs else (False,):
        for gates, split in options:
            steps = regs // _chunks(p, backward, gates, split) if use_regs else 0
            found = _side(p, units, backward, smem, threads, gates, split, steps)
            if shared_entries(p, units, backward, gates, split, threads, steps) <= found.entries:
                return found
    return None


def _smem_side(p: Problem, units: int, backward: bool, smem: int) -> Side:
    """Shared memory alone at ``THREADS`` threads, the operand in its finest chunks, whether or
    not it holds the strip (the build of an unplannable problem)."""
    return _side(p, units, backward, smem, THREADS, 1, max(_splits(p)), 0)


def layout(p: Problem, units: int, smem: int) -> tuple[Side, Side] | None:
    """The forward's and the backward's sides at one thread count: ``THREADS`` where shared
    memory holds both strips, else ``REG_THREADS`` with registers where a side needs them."""
    cells = units * rows(p) // 2  # cell threads: (unit, pair of rows) and (row, pair of units)
    for threads in (THREADS, REG_THREADS):
        if cells > threads:
            continue
        fw, bw = side(p, units, False, smem, threads), side(p, units, True, smem, threads)
        if fw is not None and bw is not None:
            return fw, bw
    return None


def scratch_words(p: Problem, units: int, sides: tuple[Side, Side]) -> int:
    """A block's scratch in the exchange buffer (the kernel's ``Shape``), the fuller side's: the
    register steps on their way, each (chunk, slot)'s entries per bank group and its pieces,
    each (chunk, warp, round, lane)'s piece and slot, then its fullest strip's entries (32 bits
    each), as the prologue finds them."""
    tables = 0
    for backward, s in enumerate(sides):
        chunks = _chunks(p, bool(backward), s.gates, s.split)
        slots = _slots(p, units, bool(backward))
        tables = max(
            tables,
            s.reg_steps * chunks * s.threads
            + chunks * slots * (64 // rows(p) + 1)
            + 2 * chunks * s.threads * s.rounds,
        )
    return cdiv(tables + strip_entries(p, units) + 1, 4) * 4


def exchange_buffer_words(p: Problem, blocks: int, scratch: int) -> int:
    """The exchange: 16-bit values [2][heads][chunks][gates_r × head_dim][rows], then a 32-bit
    counter per (head, chunk), then from the next multiple of 4 words ``scratch`` words for each
    of a launch's ``blocks`` blocks."""
    chunks = cdiv(p.batch, rows(p))
    values = 2 * p.heads * chunks * max(p.gates_r, 1) * p.head_dim * rows(p)
    words = values // 2 + p.heads * chunks
    return cdiv(words, 4) * 4 + blocks * scratch


# -- constraints ---------------------------------------------------------------------------


def sparse_r(p: Problem, caps: HardwareCaps) -> bool:
    return p.density < 1.0 and p.gates_r > 0


def full_length_only(p: Problem, caps: HardwareCaps) -> bool:
    return not p.timeline


def _layout(p: Problem, caps: HardwareCaps) -> tuple[Side, Side] | None:
    return layout(p, block_units(p.head_dim, caps.sm_count), smem_limit(caps))


def entries_fit_on_chip(p: Problem, caps: HardwareCaps) -> bool:
    return _layout(p, caps) is not None


def cell_threads(p: Problem, caps: HardwareCaps) -> bool:
    return block_units(p.head_dim, caps.sm_count) * rows(p) // 2 <= THREADS


def _room(p: Problem, units: int, backward: bool, s: Side) -> int:
    """Entries a side holds: its shared memory's and its lanes' registers'."""
    return s.entries + s.threads * s.reg_steps * _chunks(p, backward, s.gates, s.split)


def _entries_usage(p: Problem, caps: HardwareCaps, point: Point) -> tuple[float, float]:
    """(entries, room) of the fuller side; where none fits, the room of the roomiest layout
    (registers and the operand in its finest chunks)."""
    units, limit = block_units(p.head_dim, caps.sm_count), smem_limit(caps)
    need = strip_entries(p, units)
    found = layout(p, units, limit)
    sides = []
    for backward in (False, True):
        if found is not None:
            room = _room(p, units, backward, found[backward])
        else:
            split = max(_splits(p))
            steps = REG_ENTRIES[rows(p), backward] // _chunks(p, backward, 1, split)
            roomiest = _side(p, units, backward, limit, REG_THREADS, 1, split, steps)
            room = _room(p, units, backward, roomiest)
        sides.append((need, room))
    return max(sides, key=lambda side: side[0] / max(side[1], 1))


class GridSparse(Variant):
    name = "grid_sparse"
    summary = (
        "CUDA-core grid tier for a sparse R: each block keeps the non-zeros of its units' rows "
        "and columns of R on chip for the whole sequence (shared memory, and its lanes' "
        "registers where that is not enough)"
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
            "entries_fit_on_chip",
            "the non-zeros of a block's fullest strip of R (4 bytes each) fit its shared "
            "memory beside h or a gate's rows of dg, with its lanes' registers "
            f"({REG_ENTRIES[4, False]} a thread forward, {REG_ENTRIES[4, True]} backward, at "
            f"{REG_THREADS} threads; {REG_ENTRIES[8, False]} at 8 batch rows) "
            "where shared memory alone does not",
            entries_fit_on_chip,
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
        found = layout(p, units, smem)
        if found is not None:
            fw, bw = found
        else:  # unplannable (the constraints say why): shared memory alone, in halves
            fw, bw = (_smem_side(p, units, backward, smem) for backward in (False, True))
        return {
            "variant": self.name,
            "D": p.head_dim,
            "units": units,
            "rows": rows(p),
            "threads": fw.threads,
            "fw_entries": fw.entries,
            "bw_entries": bw.entries,
            "fw_smem": fw.smem,
            "bw_smem": bw.smem,
            "bw_gates": bw.gates,
            "fw_split": fw.split,
            "bw_split": bw.split,
            "fw_reg_steps": fw.reg_steps,
            "bw_reg_steps": bw.reg_steps,
            "fw_rounds": fw.rounds,
            "bw_rounds": bw.rounds,
            "scratch": scratch_words(p, units, (fw, bw)),
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
            KernelLaunch(0, b["threads"], b["fw_smem"], grid, launches),
            KernelLaunch(0, b["threads"], b["bw_smem"], grid, launches),
            b["exchange_words"],
            exchange_buffer_words(problem, grid[0] * heads * chunks, b["scratch"]),
        )

    def cost(self, problem: Problem, caps: HardwareCaps, point: Point) -> Cost:
        p = problem
        units, nb, limit = block_units(p.head_dim, caps.sm_count), rows(p), smem_limit(caps)
        gr = max(p.gates_r, 1)
        entries_us = strip_entries(p, units) * ENTRY_US * (ROWS8_ENTRY if nb == 8 else 1.0)
        l2 = caps.l2_gbs_per_sm * 1e3  # bytes per µs into one SM after the wait
        found = layout(p, units, limit)
        fw, bw = found if found is not None else (None, None)
        terms: tuple[tuple[str, float], ...] = (
            ("step", FORWARD_STEP_US),
            ("gather", p.head_dim * nb * p.dtype_bytes / l2),
            ("slots", SLOT_US * gr * units),
            ("entries", entries_us),
        )
        unit = sum(us for _, us in terms)
        chunks = _chunks(p, True, bw.gates, bw.split) if bw else gr * max(_splits(p))
        per_chunk = BACKWARD_CHUNK_US + BACKWARD_CHUNK_US_PER_UNIT * p.head_dim
        backward = (
            BACKWARD_STEP_US
            + gr * p.head_dim * nb * p.dtype_bytes / l2
            + entries_us
            + (chunks - 1) * per_chunk
        )
        if fw is not None and fw.threads == REG_THREADS:
            factor = REG_LAYOUT_FW if fw.reg_steps else SHARED_256_FW
            terms = tuple((name, us * factor) for name, us in terms)
            unit *= factor
        if bw is not None and bw.threads == REG_THREADS:
            backward *= REG_LAYOUT_BW
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
            ("int", "kFwRegSteps", build["fw_reg_steps"]),
            ("int", "kBwRegSteps", build["bw_reg_steps"]),
            ("int", "kFwRounds", build["fw_rounds"]),
            ("int", "kBwRounds", build["bw_rounds"]),
            ("int", "kScratch", build["scratch"]),
        ]
        return render_fused(cell, bwd, self.name, build, traits, fast=True)
