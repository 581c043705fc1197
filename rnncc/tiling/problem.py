"""The tiling problem: sizes, storage dtype and the pointwise cost of a cell.

Input: an IR cell (its declarations' counts and ``rnncc.ir.op_counts`` only) and the sizes
(heads, head dim, batch, dtype). Output: a frozen ``Problem``.

The pointwise cost is per element (one hidden unit of one batch column) per step: MUFU
instructions (special functions at their own throughput), plain ALU instructions, and the
registers the cell's temporaries need; each op's instruction mix is its row of the op table
(``rnncc.ir.ops``).

Invariants: sizes are positive, ``gates_r >= 0`` (0: no recurrent matrix product at all),
``dtype`` is one of ``DTYPES``. Non-goals: liveness analysis of the cell (``cell_regs`` is an
estimate from the op counts); the backward cell's own op mix (the variants scale the
forward's).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rnncc.variants.pieces import SlotCounts

DTYPES: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2}  # storage dtype → bytes


@dataclass(frozen=True)
class Problem:
    """One tiling problem. ``head_dim`` is D of one head; ``hidden = heads × head_dim``."""

    gates_r: int
    heads: int
    head_dim: int
    batch: int
    dtype: str = "bf16"
    n_states: int = 1
    gates_x: int = -1  # W x gates; -1: as many as gates_r
    gates_b: int = -1  # bias gates; -1: as many as gates_r
    n_params: int = 0
    n_outputs: int = 1
    mufu_ops: int = 0  # MUFU instructions per element per step
    alu_ops: int = 0  # plain fp32 instructions per element per step
    cell_regs: int = 8  # registers the cell's temporaries need per element in flight
    # per-row lengths or the reverse direction: the fused kernels map each row's steps to its
    # positions (rnncc_abi.h), built apart from the full-length forward ones
    timeline: bool = False
    # R's kept fraction (a mask: its dropped entries are zeros) in the fullest strip of units
    # that the sparse variant's blocks own (``rnncc.variants.grid_sparse``); 1.0: dense
    density: float = 1.0
    # the same in the fullest piece (half of a strip, by the chunks the sparse kernels stage the
    # operand in: ``rnncc.runtime.sparsity.piece_density``); None: ``density``
    piece_density: float | None = None
    # a mask's entries per (block, chunk, slot) (``rnncc.runtime.sparsity.slot_counts``): the
    # sparse kernels' layout of exactly these (``rnncc.variants.pieces``); None: the densities
    # estimate it. Not part of a problem's identity (its densities are).
    slot_counts: SlotCounts | None = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        for field in ("heads", "head_dim", "batch", "n_states"):
            if getattr(self, field) < 1:
                raise ValueError(f"{field} must be positive, got {getattr(self, field)}")
        if self.gates_x < 0:
            object.__setattr__(self, "gates_x", self.gates_r)
        if self.gates_b < 0:
            object.__setattr__(self, "gates_b", self.gates_r)
        for field in (
            "gates_r",
            "gates_x",
            "gates_b",
            "n_params",
            "mufu_ops",
            "alu_ops",
            "cell_regs",
        ):
            if getattr(self, field) < 0:
                raise ValueError(f"{field} must not be negative, got {getattr(self, field)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if not 0.0 <= self.density <= 1.0:
            raise ValueError(f"density must be in [0, 1], got {self.density}")
        if self.piece_density is not None and not self.density <= self.piece_density <= 1.0:
            raise ValueError(
                f"piece_density must be in [density, 1] = [{self.density}, 1], got {self.piece_density}"
            )

    @property
    def chunk_density(self) -> float:
        """The kept fraction of the fullest piece (``density`` where none was measured)."""
        return self.density if self.piece_density is None else self.piece_density

    @property
    def dtype_bytes(self) -> int:
        return DTYPES[self.dtype]

    @property
    def gates_in(self) -> int:
        """Gate values per element loaded from ``Wx`` each step, at least one."""
        return max(self.gates_x, 1)

    @property
    def r_bytes_per_head(self) -> int:
        return self.gates_r * self.head_dim * self.head_dim * self.dtype_bytes

    def describe(self) -> str:
        return (
            f"Gr={self.gates_r}, NH={self.heads}, D={self.head_dim}, B={self.batch}, {self.dtype}"
            + (", per-row lengths or reversed" if self.timeline else "")
            + (f", R {self.density:.1%} dense" if self.density < 1.0 else "")
        )

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "slot_counts"}

    @classmethod
    def from_cell(
        cls,
        cell: Any,
        *,
        heads: int,
        head_dim: int,
        batch: int,
        dtype: str = "bf16",
        op_counts: Mapping[str, int] | None = None,
        timeline: bool = False,
        density: float = 1.0,
        piece_density: float | None = None,
        slot_counts: SlotCounts | None = None,
    ) -> Problem:
        """The problem of an IR cell at the given sizes.

        Reads the counts of the cell's gates, states, params and outputs and
        ``rnncc.ir.op_counts(cell)`` (or the ``op_counts`` given), nothing else of the cell.
        """
        if op_counts is None:
            op_counts = importlib.import_module("rnncc.ir").op_counts(cell)
        mufu, alu = pointwise_mix(op_counts)
        n_states = len(tuple(cell.states))
        return cls(
            gates_r=len(tuple(cell.gr_names)),
            heads=heads,
            head_dim=head_dim,
            batch=batch,
            dtype=dtype,
            n_states=n_states,
            gates_x=len(tuple(cell.gx_names)),
            gates_b=len(tuple(cell.gb_names)),
            n_params=len(tuple(cell.params)),
            n_outputs=len(tuple(cell.outputs)),
            mufu_ops=mufu,
            alu_ops=alu,
            cell_regs=estimate_cell_regs(op_counts),
            timeline=timeline,
            density=density,
            piece_density=piece_density,
            slot_counts=slot_counts,
        )


def pointwise_mix(op_counts: Mapping[str, int]) -> tuple[int, int]:
    """(MUFU, ALU) instructions per element per step for the given op counts, from the op
    table's rows (``rnncc.ir.ops``, imported here so that planning a problem needs no torch)."""
    ops = importlib.import_module("rnncc.ir.ops").OPS
    mufu = sum(ops[op].mufu * n for op, n in op_counts.items())
    alu = sum(ops[op].alu * n for op, n in op_counts.items())
    return mufu, alu


def estimate_cell_regs(op_counts: Mapping[str, int]) -> int:
    """Registers the cell's temporaries need per element: a bound from the count of non-leaf
    ops (a third of them live at once, at least 4, at most 32) — the IR gives no liveness."""
    ops = importlib.import_module("rnncc.ir.ops").OPS
    work = sum(c for op, c in op_counts.items() if (ops[op].mufu, ops[op].alu) != (0, 0))
    return max(4, min(32, 4 + work // 3))
