"""The tiling plan: one feasible point of the model, resolved into what a kernel writer needs.

Input: a ``Model``, a feasible ``Point``, its ``Layout`` and ``Cost``. Output: a frozen
``TilingPlan`` — the unit (head group × batch chunk) and how it maps onto blocks, clusters or
the grid, warps, the MMA and its tile, padding and masking, where R lives, the barrier, the
units for the given batch, the predicted µs per step — with ``explain()`` for people and
``as_dict()`` for JSON.

Invariants: a plan is only built from a point that satisfies every constraint of its model
(solve.py guarantees it; ``solve.check_plan`` re-checks). ``batch_chunk`` is compile-time;
``n_chunks`` and ``n_units`` describe the batch the plan was solved for and are a runtime grid
dimension. Non-goals: the backward kernel's own tiling (the backward estimate assumes the
same split with Rᵀ).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rnncc.tiling.cost import Cost
from rnncc.tiling.hardware import HardwareCaps
from rnncc.tiling.model import MMA_KINDS, Layout, Model, Point
from rnncc.tiling.problem import Problem

BINDING_SHARE = 0.9  # a constraint using this share of its limit or more is reported binding
BARRIER_NAMES = {"block": "syncthreads", "cluster": "cluster", "grid": "grid"}


@dataclass(frozen=True)
class TilingPlan:
    """A plan for the fused persistent kernel. Sizes per block unless named otherwise."""

    problem: Problem
    caps: HardwareCaps
    tier: str  # "block" | "cluster" | "grid"
    heads_per_unit: int
    batch_chunk: int  # compile-time batch columns per unit
    batch_chunk_padded: int  # the MMA's N; columns beyond the batch are masked
    blocks_per_unit: int  # cluster size (cluster tier), blocks per head (grid tier), or 1
    cluster_nonportable: bool  # a cluster larger than the portable 8: needs the opt-in
    warps: int
    warps_m: int
    warps_k: int
    threads: int
    blocks_per_sm: int
    mma: str  # "mma_sync" | "wgmma" | "tf32x3" | "none"
    mma_ptx: str
    mma_tile: tuple[int, int, int]  # (m, n, k) of one instruction
    head_dim_padded: int  # D padded to the tiles; padded rows and columns are zero
    units_per_block: int  # hidden units of each head in one block (all their gates)
    rows_per_block: int  # rows of R
    r_bytes_per_block: int
    r_reg_bytes_per_block: int  # as MMA A fragments
    r_smem_bytes_per_block: int
    regs_per_thread: int
    smem_bytes_per_block: int
    barrier: str  # "syncthreads" | "cluster" | "grid" | "none"
    n_chunks: int  # for this problem's batch
    n_units: int
    total_blocks: int
    waves: int  # rounds of units run one after the other (grid tier: cooperative launches)
    r_replicated: bool  # each batch chunk's unit holds its own copy of R
    masked_batch_columns: int  # n_chunks × batch_chunk_padded − batch
    predicted_us_per_step: float  # forward
    predicted_bwd_us_per_step: float
    cost: Cost
    usage: tuple[tuple[str, float, float], ...]  # (hardware constraint, used, limit)

    @classmethod
    def build(cls, model: Model, point: Point, layout: Layout, cost: Cost) -> TilingPlan:
        p, caps = model.problem, model.caps
        kind = MMA_KINDS[point.mma]
        tile = (64, layout.batch_chunk_padded, 16) if point.mma == "wgmma" else kind.tile
        usage = tuple(
            (c.name, float(used), float(limit))
            for c in model.constraints
            if c.usage is not None
            for used, limit in [c.usage(layout)]
        )
        return cls(
            problem=p,
            caps=caps,
            tier=point.tier,
            heads_per_unit=point.heads_per_unit,
            batch_chunk=point.batch_chunk,
            batch_chunk_padded=layout.batch_chunk_padded,
            blocks_per_unit=point.blocks_per_unit,
            cluster_nonportable=point.tier == "cluster"
            and point.blocks_per_unit > caps.max_cluster,
            warps=point.warps_m * point.warps_k,
            warps_m=point.warps_m,
            warps_k=point.warps_k,
            threads=layout.threads,
            blocks_per_sm=point.blocks_per_sm,
            mma=point.mma,
            mma_ptx=kind.ptx,
            mma_tile=tile,
            head_dim_padded=point.head_dim_padded,
            units_per_block=layout.units_per_block,
            rows_per_block=layout.rows_per_block,
            r_bytes_per_block=layout.r_bytes,
            r_reg_bytes_per_block=layout.r_reg_bytes,
            r_smem_bytes_per_block=layout.r_smem_bytes,
            regs_per_thread=layout.regs_per_thread,
            smem_bytes_per_block=layout.smem_bytes,
            barrier="none" if p.gates_r == 0 else BARRIER_NAMES[point.tier],
            n_chunks=layout.n_chunks,
            n_units=layout.n_units,
            total_blocks=layout.total_blocks,
            waves=cost.waves,
            r_replicated=p.gates_r > 0 and layout.n_chunks > 1,
            masked_batch_columns=layout.n_chunks * layout.batch_chunk_padded - p.batch,
            predicted_us_per_step=cost.forward_us,
            predicted_bwd_us_per_step=cost.backward_us,
            cost=cost,
            usage=usage,
        )

    @property
    def point(self) -> Point:
        """The model variables this plan was built from."""
        return Point(
            tier=self.tier,
            mma=self.mma,
            heads_per_unit=self.heads_per_unit,
            blocks_per_unit=self.blocks_per_unit,
            head_dim_padded=self.head_dim_padded,
            batch_chunk=self.batch_chunk,
            warps_m=self.warps_m,
            warps_k=self.warps_k,
            blocks_per_sm=self.blocks_per_sm,
        )

    def units_for(self, batch: int) -> int:
        """Units (head groups × batch chunks) for a batch of this size: the runtime grid
        dimension; the tail chunk is masked."""
        return (self.problem.heads // self.heads_per_unit) * -(-batch // self.batch_chunk)

    @property
    def binding(self) -> tuple[str, ...]:
        """Hardware constraints at or above ``BINDING_SHARE`` of their limit."""
        return tuple(
            name for name, used, limit in self.usage if limit and used >= BINDING_SHARE * limit
        )

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if hasattr(value, "as_dict"):
                value = value.as_dict()
            elif name == "usage":
                value = [{"constraint": n, "used": u, "limit": lim} for n, u, lim in value]
            elif isinstance(value, tuple):
                value = list(value)
            out[name] = value
        out["binding"] = list(self.binding)
        return out

    def explain(self) -> str:
        """The plan in words: unit, block, R placement, padding, binding constraints, cost."""
        from rnncc.tiling.solve import other_tiers  # solve imports this module

        p, caps, c = self.problem, self.caps, self.cost
        lines = [
            f"tiling plan for {p.describe()} on {caps.name} ({caps.arch}, {caps.sm_count} SMs)",
        ]
        add = lines.append
        tier = {
            "block": "block: one unit per block, "
            + ("no barrier (elementwise cell)" if p.gates_r == 0 else "block barriers only"),
            "cluster": f"cluster of {self.blocks_per_unit} blocks per unit, h exchanged through "
            "DSMEM" + (" (non-portable size: opt-in)" if self.cluster_nonportable else ""),
            "grid": f"grid: {self.blocks_per_unit} blocks per head, whole grid co-resident, "
            "h exchanged through L2",
        }[self.tier]
        add(f"  tier        {tier}")
        for other, best, names in other_tiers(self):
            if best is None:
                add(
                    f"              ({other} tier ruled out by {', '.join(names) or 'its structure'})"
                )
            else:
                add(f"              ({other} tier feasible, best {best:.3f} µs/step forward)")
        head_groups = p.heads // self.heads_per_unit
        replicated = f"; R replicated ×{self.n_chunks}" if self.r_replicated else ""
        add(
            f"  unit        {self.heads_per_unit} head(s) × batch chunk {self.batch_chunk} "
            f"(compile-time); {self.n_units} units = {head_groups} head groups × "
            f"{self.n_chunks} chunks of B={p.batch}{replicated}"
        )
        add(
            f"  grid        {self.total_blocks} blocks, {self.blocks_per_sm} per SM, "
            f"{self.waves} wave(s); barrier: {self.barrier}"
        )
        add(
            f"  block       {self.warps} warps ({self.warps_m} along rows × {self.warps_k} along "
            f"K), {self.threads} threads, {self.regs_per_thread} registers/thread"
        )
        if p.gates_r:
            m, n, k = self.mma_tile
            add(f"  mma         {self.mma_ptx}, tile m{m}n{n}k{k}")
            add(
                f"  R           {self.rows_per_block} rows × {self.head_dim_padded} = "
                f"{_size(self.r_bytes_per_block)} per block: "
                f"{_size(self.r_reg_bytes_per_block)} in registers, "
                f"{_size(self.r_smem_bytes_per_block)} in shared memory"
            )
        add(
            f"  padding     D {p.head_dim} → {self.head_dim_padded}; batch chunk "
            f"{self.batch_chunk} → {self.batch_chunk_padded} ({self.masked_batch_columns} "
            f"masked columns for B={p.batch})"
        )
        add(f"  smem        {_size(self.smem_bytes_per_block)} per block")
        usage = ", ".join(f"{name} {used / limit:.0%}" for name, used, limit in self.usage if limit)
        add(f"  usage       {usage}")
        add(f"  binding     {', '.join(self.binding) or 'none (all below 90 %)'}")
        add(
            f"  cost        {self.predicted_us_per_step:.3f} µs/step forward = "
            f"{c.waves} wave(s) × (barrier {c.barrier_us:.3f} + mma {c.mma_us:.3f} "
            f"[smem stream {c.smem_us:.3f}] + split-K {c.splitk_us:.3f} + pointwise "
            f"{c.pointwise_us:.3f} + h exchange {c.exchange_us:.3f})"
            + (f", HBM floor {c.hbm_us:.3f}" if c.hbm_us >= c.waves * c.unit_us else "")
        )
        add(
            f"              {self.predicted_bwd_us_per_step:.3f} µs/step backward "
            f"(incl. dh partial-sum reduction {c.reduction_us:.3f})"
        )
        return "\n".join(lines)


def _size(n: float) -> str:
    if n >= 1 << 20:
        return f"{n / (1 << 20):.2f} MiB"
    if n >= 1 << 10:
        return f"{n / (1 << 10):.1f} KiB"
    return f"{int(n)} B"
