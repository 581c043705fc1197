"""The declarative tiling model: variables with finite domains and named constraints.

Input: a ``Problem`` and ``HardwareCaps``. Output: a ``Model`` — the domain of every variable
(``VARIABLES``), the list of ``Constraint`` objects (each a named predicate over a few
variables), and ``layout(point)``, the quantities a point implies (rows of R per block, bytes
of R in registers and in shared memory, registers per thread, shared memory per block, units,
blocks). solve.py hands the variables and constraints to python-constraint2; plan checking
and error diagnosis evaluate the same constraint objects on a point.

The kernel modelled (DESIGN.md §3): per step each unit (a group of heads × a batch chunk)
computes ``g = Wx[t] + R·h[t-1] + b`` over ``Gr·D_pad`` rows per head with tensor-core MMAs,
rows as M, ``D_pad`` as K, the batch chunk as N (padded to the MMA's N granule; masked
columns), fp32 accumulation. The rows of a head are split by hidden unit (all Gr gates of a
unit stay in one block, so the pointwise cell runs on the block's own accumulators) over
``blocks_per_unit`` blocks; warps split a block's M tiles (``warps_m``) and K (``warps_k``,
split-K with a shared-memory reduction). Each block keeps its slice of R in registers as MMA
A fragments first, as many as the register budget leaves room for, and the rest in shared
memory next to the h, Wx-prefetch and split-K buffers.

Invariants: every constraint's predicate is a pure function of the variables it names;
``layout`` is a pure function of a full point. Constraint kinds: ``structure`` (tile
divisibility, tier shapes), ``hardware`` (limits of the device), ``dominance`` (removes points
that are never better, e.g. padding beyond what the tiles need); diagnosis ignores the
last kind. Non-goals: heads split across blocks *and* grouped in one unit; register
allocation beyond a per-thread count rounded to the allocation granule.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from rnncc.tiling.hardware import HardwareCaps
from rnncc.tiling.problem import Problem

VARIABLES: tuple[str, ...] = (
    "tier",  # "block" | "cluster" | "grid": how the blocks of a unit synchronise
    "mma",  # MmaKind name
    "heads_per_unit",  # heads of one unit (block tier only: > 1)
    "blocks_per_unit",  # blocks a head's rows are split over (cluster size / grid blocks)
    "head_dim_padded",  # D padded to the tiles; the padding is masked
    "batch_chunk",  # compile-time batch columns per unit (N before padding)
    "warps_m",  # warps along the rows of R
    "warps_k",  # warps along K (split-K)
    "blocks_per_sm",  # co-resident blocks per SM
)
TIERS: tuple[str, ...] = ("block", "cluster", "grid")
BLOCKS_PER_SM: tuple[int, ...] = (1, 2, 4)
WARPS_M: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
WARPS_K: tuple[int, ...] = (1, 2, 4, 8)
MAX_BATCH_CHUNK = 256  # wgmma's largest N; also a sensible compile-time unit
D_PAD_QUANTA: tuple[int, ...] = (8, 16, 32, 64, 128)

FRAGMENT_BYTES_PER_THREAD = 16  # an A fragment is 4 registers per thread for every MMA kind
BASE_REGS = 32  # addresses, indices, loop and barrier state
REG_GRANULE = 8  # registers are allocated per thread in multiples of 8 (256 per warp)
SMEM_BOOKKEEPING = 256  # mbarriers, flags
H_STAGES = 3  # grid tier: h arrives from L2 through a ring of K slices, not all at once
H_SLICE = 64  # columns of K per ring slot


@dataclass(frozen=True)
class MmaKind:
    """One way to compute the product: its PTX tile and how it constrains warps and padding."""

    name: str
    tile: tuple[int, int, int]  # (m, n, k) of one instruction; n = 0: the padded batch chunk
    m_per_warp: int
    n_granule: int  # the batch chunk is padded to a multiple of this
    k: int
    warp_multiple: int  # warps_m must be a multiple of this (a wgmma warpgroup: 4)
    b_regs_per_n_tile: int  # registers per thread holding h fragments, per 8 columns
    ptx: str


MMA_KINDS: dict[str, MmaKind] = {
    "mma_sync": MmaKind("mma_sync", (16, 8, 16), 16, 8, 16, 1, 4, "mma.sync.m16n8k16 → fp32"),
    "wgmma": MmaKind("wgmma", (64, 0, 16), 16, 8, 16, 4, 0, "wgmma.m64nNk16 (A in registers)"),
    "tf32x3": MmaKind("tf32x3", (16, 8, 8), 16, 8, 8, 1, 8, "3× mma.sync.m16n8k8.tf32 (split)"),
    "none": MmaKind("none", (1, 1, 1), 1, 1, 1, 1, 0, "no recurrent product (elementwise)"),
}


def mma_kinds_for(problem: Problem, caps: HardwareCaps) -> tuple[str, ...]:
    """MMA kinds that can compute this problem's product on this device, in a fixed order."""
    if problem.gates_r == 0:
        return ("none",)
    if problem.dtype == "fp32":
        return ("tf32x3",)  # an fp32-accurate product: hi·hi + hi·lo + lo·hi in TF32
    return ("mma_sync", "wgmma") if caps.has_wgmma else ("mma_sync",)


@dataclass(frozen=True)
class Point:
    """One assignment of every variable."""

    tier: str
    mma: str
    heads_per_unit: int
    blocks_per_unit: int
    head_dim_padded: int
    batch_chunk: int
    warps_m: int
    warps_k: int
    blocks_per_sm: int

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> Point:
        return cls(**{v: values[v] for v in VARIABLES})

    def values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, v) for v in VARIABLES)


class Layout(NamedTuple):
    """What a point implies for one block (sizes in elements or bytes, registers per thread)."""

    units_per_block: int  # hidden units of each head held by one block
    rows_per_block: int  # rows of R (Gr × heads × units)
    elements_per_block: int  # (unit, padded batch column) pairs the pointwise cell computes
    batch_chunk_padded: int
    m_tiles: int  # 16-row MMA tiles of the block
    n_tiles: int  # 8-column tiles
    k_tiles: int
    threads: int
    regs_fixed: int  # per thread: everything but R
    regs_limit: int  # per thread, from both the per-thread and the per-SM budget
    regs_per_thread: int
    r_bytes: int  # R per block
    r_reg_bytes: int
    r_smem_bytes: int
    h_smem_bytes: int
    wx_smem_bytes: int
    splitk_smem_bytes: int
    smem_fixed: int  # everything but R
    smem_bytes: int
    n_chunks: int
    n_units: int
    total_blocks: int
    blocks_per_sm: int


def _divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def _round_up(n: int, q: int) -> int:
    return -(-n // q) * q


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def unit_slots(caps: HardwareCaps, tier: str, blocks_per_unit: int, blocks_per_sm: int) -> int:
    """Units that run at once. Block tier: a block per slot. Cluster tier: clusters are
    placed within one GPC each (SMs spread evenly over the GPCs). Grid tier: the units of one
    cooperative launch, one block per SM; further units go to the next launch."""
    if tier == "block":
        return caps.sm_count * blocks_per_sm
    if tier == "grid":
        return caps.sm_count // blocks_per_unit
    base, extra = divmod(caps.sm_count, caps.gpcs)
    sizes = [base + 1] * extra + [base] * (caps.gpcs - extra)
    return sum(size * blocks_per_sm // blocks_per_unit for size in sizes)


@dataclass(frozen=True)
class Constraint:
    """A named predicate over some variables. ``usage`` (hardware constraints on a layout)
    returns (used, limit) so that a plan can say how tight the constraint is."""

    name: str
    kind: str  # "structure" | "hardware" | "dominance"
    variables: tuple[str, ...]
    test: Callable[..., bool]  # called with the named variables' values, in order
    doc: str
    usage: Callable[[Layout], tuple[float, float]] | None = None

    def holds(self, point: Point) -> bool:
        return bool(self.test(*(getattr(point, v) for v in self.variables)))


class Model:
    """Domains, constraints and the layout of points for one problem on one device."""

    def __init__(self, problem: Problem, caps: HardwareCaps):
        self.problem = problem
        self.caps = caps
        self.domains = self._domains()
        self.constraints = self._constraints()
        self._layouts: dict[tuple[Any, ...], Layout] = {}

    # -- domains ---------------------------------------------------------------------------

    def _domains(self) -> dict[str, tuple[Any, ...]]:
        p, caps = self.problem, self.caps
        chunks = tuple(
            c for c in (1 << i for i in range(9)) if c <= min(MAX_BATCH_CHUNK, _next_pow2(p.batch))
        )
        if p.gates_r == 0:  # elementwise: no R to split, no head dim to pad
            return {
                "tier": ("block",),
                "mma": ("none",),
                "heads_per_unit": _divisors(p.heads),
                "blocks_per_unit": (1,),
                "head_dim_padded": (p.head_dim,),
                "batch_chunk": chunks,
                "warps_m": WARPS_M,
                "warps_k": (1,),
                "blocks_per_sm": BLOCKS_PER_SM,
            }
        pads = tuple(sorted({_round_up(p.head_dim, q) for q in D_PAD_QUANTA}))
        splits = sorted(
            {b for d in pads for b in _divisors(d) if b <= caps.sm_count}
            | set(range(1, caps.max_cluster_nonportable + 1))
        )
        return {
            "tier": TIERS,
            "mma": mma_kinds_for(p, caps),
            "heads_per_unit": _divisors(p.heads),
            "blocks_per_unit": tuple(splits),
            "head_dim_padded": pads,
            "batch_chunk": chunks,
            "warps_m": WARPS_M,
            "warps_k": WARPS_K,
            "blocks_per_sm": BLOCKS_PER_SM,
        }

    # -- layout ----------------------------------------------------------------------------

    def layout(self, point: Point) -> Layout:
        return self.layout_of(*point.values())

    def layout_of(self, *values: Any) -> Layout:
        """``layout`` of the point given as values in ``VARIABLES`` order (for the solver)."""
        cached = self._layouts.get(values)
        if cached is None:
            cached = self._layouts[values] = self._layout(*values)
        return cached

    def _layout(
        self,
        tier: str,
        mma_name: str,
        hpu: int,
        bpu: int,
        d_pad: int,
        bc: int,
        wm: int,
        wk: int,
        bps: int,
    ) -> Layout:
        p, caps = self.problem, self.caps
        mma = MMA_KINDS[mma_name]
        es = p.dtype_bytes
        bc_pad = _round_up(bc, mma.n_granule)
        units = d_pad // bpu
        rows = p.gates_r * hpu * units
        elements = hpu * units * bc_pad
        threads = 32 * wm * wk
        n_tiles = max(1, bc_pad // 8)

        per_thread = -(-elements // threads)
        accum = rows * bc_pad * wk // threads
        b_frags = mma.b_regs_per_n_tile * n_tiles + (8 if mma_name == "tf32x3" else 0)
        pointwise = per_thread * p.n_states + min(per_thread, 2) * p.cell_regs
        regs_fixed = BASE_REGS + accum + b_frags + pointwise
        per_sm_share = caps.regs_per_sm // (threads * bps) // REG_GRANULE
        regs_limit = min(caps.max_regs_per_thread, per_sm_share * REG_GRANULE)

        r_bytes = rows * d_pad * es
        frags = r_bytes // (threads * FRAGMENT_BYTES_PER_THREAD)
        reg_frags = min(frags, max(0, regs_limit - regs_fixed) // 4)
        r_reg_bytes = reg_frags * threads * FRAGMENT_BYTES_PER_THREAD

        if p.gates_r == 0:
            h_smem = 0
        elif tier == "grid":  # streamed from L2 like a GEMM main loop
            h_smem = min(d_pad, H_STAGES * H_SLICE * wk) * bc_pad * es
        else:  # all of h; DSMEM writes of step t+1 need a second buffer
            h_smem = hpu * d_pad * bc_pad * es * (2 if tier == "cluster" else 1)
        wx_smem = p.gates_in * elements * es * 2  # double-buffered prefetch of Wx[t+1]
        splitk_smem = rows * bc_pad * 4 * wk if wk > 1 else 0
        smem_fixed = h_smem + wx_smem + splitk_smem + SMEM_BOOKKEEPING

        n_chunks = -(-p.batch // bc)
        n_units = (p.heads // hpu) * n_chunks
        return Layout(  # positional, in field order: the solver builds thousands
            units,
            rows,
            elements,
            bc_pad,
            rows // 16,
            n_tiles,
            d_pad // mma.k if p.gates_r else 0,
            threads,
            regs_fixed,
            regs_limit,
            regs_fixed + 4 * reg_frags,
            r_bytes,
            r_reg_bytes,
            r_bytes - r_reg_bytes,
            h_smem,
            wx_smem,
            splitk_smem,
            smem_fixed,
            smem_fixed + r_bytes - r_reg_bytes,
            n_chunks,
            n_units,
            n_units * bpu,
            bps,
        )

    # -- constraints -----------------------------------------------------------------------

    def _tiles_divide(
        self, mma_name: str, hpu: int, bpu: int, d_pad: int, wm: int, wk: int
    ) -> bool:
        """The divisibility every MMA point needs (shared by three constraints and padding)."""
        mma = MMA_KINDS[mma_name]
        if mma_name == "none":
            return True
        if d_pad % bpu:
            return False
        rows = self.problem.gates_r * hpu * (d_pad // bpu)
        return (
            d_pad % (mma.k * wk) == 0
            and rows % (mma.m_per_warp * wm) == 0
            and wm % mma.warp_multiple == 0
        )

    def _constraints(self) -> list[Constraint]:
        p, caps = self.problem, self.caps
        whole_batch = _next_pow2(p.batch)
        pads = self.domains["head_dim_padded"]
        everything = VARIABLES

        def tier_matches_blocks(tier: str, bpu: int) -> bool:
            return (tier == "block") == (bpu == 1)

        def heads_grouped_only_in_block_tier(hpu: int, bpu: int) -> bool:
            return hpu == 1 or bpu == 1

        def hidden_units_split_evenly(d_pad: int, bpu: int) -> bool:
            return d_pad % bpu == 0

        def mma_k_divides_head_dim(mma: str, d_pad: int, wk: int) -> bool:
            kind = MMA_KINDS[mma]
            return mma == "none" or d_pad % (kind.k * wk) == 0

        def mma_m_divides_rows(mma: str, hpu: int, bpu: int, d_pad: int, wm: int) -> bool:
            kind = MMA_KINDS[mma]
            if mma == "none" or d_pad % bpu:
                return True  # "none" has no rows; the split is hidden_units_split_evenly's
            rows = p.gates_r * hpu * (d_pad // bpu)
            return rows % (kind.m_per_warp * wm) == 0 and wm % kind.warp_multiple == 0

        def batch_chunk_fills_mma_n(mma: str, bc: int) -> bool:
            return bc % MMA_KINDS[mma].n_granule == 0 or bc == whole_batch

        def warps_have_work(mma: str, hpu: int, d_pad: int, bc: int, wm: int, wk: int) -> bool:
            if mma != "none":
                return True  # the MMA divisibility constraints give every warp whole tiles
            return wk == 1 and 32 * wm <= max(32, hpu * d_pad * bc)

        def threads_per_block(wm: int, wk: int) -> bool:
            return 32 * wm * wk <= caps.max_threads_per_block

        def threads_per_sm(wm: int, wk: int, bps: int) -> bool:
            return 32 * wm * wk * bps <= caps.max_threads_per_sm and bps <= caps.max_blocks_per_sm

        def cluster_size_limit(tier: str, bpu: int) -> bool:
            return tier != "cluster" or 2 <= bpu <= caps.max_cluster_nonportable

        def cluster_fits_gpc(tier: str, bpu: int, bps: int) -> bool:
            return tier != "cluster" or bpu <= caps.max_sms_per_gpc * bps

        def grid_co_residency(tier: str, bpu: int, bps: int) -> bool:
            return tier != "grid" or (bps == 1 and bpu <= caps.sm_count)

        def co_residence_only_when_needed(tier: str, hpu: int, bpu: int, bc: int, bps: int) -> bool:
            if bps == 1:
                return True
            units = (p.heads // hpu) * -(-p.batch // bc)
            return unit_slots(caps, tier, bpu, bps // 2) < units

        def registers_per_thread(*values: Any) -> bool:
            return self.layout_of(*values).regs_per_thread <= caps.max_regs_per_thread

        def registers_per_sm(*values: Any) -> bool:
            lay = self.layout_of(*values)
            return _regs_alloc(lay) <= caps.regs_per_sm

        def shared_memory_per_block(*values: Any) -> bool:
            return self.layout_of(*values).smem_fixed <= caps.smem_per_block_optin

        def r_fits_sm_capacity(mma: str, hpu: int, bpu: int, d_pad: int, bps: int) -> bool:
            if d_pad % bpu:
                return True  # hidden_units_split_evenly's business
            r_bytes = p.gates_r * hpu * (d_pad // bpu) * d_pad * p.dtype_bytes
            return r_bytes <= 4 * caps.regs_per_sm // bps + caps.smem_per_block_optin

        def r_fits_on_chip(*values: Any) -> bool:
            lay = self.layout_of(*values)
            return lay.r_smem_bytes <= max(0, caps.smem_per_block_optin - lay.smem_fixed)

        def shared_memory_per_sm(*values: Any) -> bool:
            lay = self.layout_of(*values)
            if lay.blocks_per_sm == 1:  # implied: opt-in + the reservation ≤ per SM
                return True
            per_block = lay.smem_bytes + caps.smem_reserved_per_block
            return per_block * lay.blocks_per_sm <= caps.smem_per_sm

        def padding_minimal(mma: str, hpu: int, bpu: int, d_pad: int) -> bool:
            # The least padding that lets the split and the tiles divide with the fewest warps;
            # more warps never justify more padding.
            fewest = MMA_KINDS[mma].warp_multiple
            return not any(
                c < d_pad and self._tiles_divide(mma, hpu, bpu, c, fewest, 1) for c in pads
            )

        def n(*names: str) -> tuple[str, ...]:
            return names

        optin, smem_sm, regs_sm = caps.smem_per_block_optin, caps.smem_per_sm, caps.regs_per_sm
        return [
            Constraint(
                "tier_matches_blocks",
                "structure",
                n("tier", "blocks_per_unit"),
                tier_matches_blocks,
                "a block-tier unit is one block; cluster and grid units have several",
            ),
            Constraint(
                "heads_grouped_only_in_block_tier",
                "structure",
                n("heads_per_unit", "blocks_per_unit"),
                heads_grouped_only_in_block_tier,
                "a unit of several heads lives in one block",
            ),
            Constraint(
                "hidden_units_split_evenly",
                "structure",
                n("head_dim_padded", "blocks_per_unit"),
                hidden_units_split_evenly,
                "every block of a unit holds the same number of hidden units (all their gates)",
            ),
            Constraint(
                "mma_k_divides_head_dim",
                "structure",
                n("mma", "head_dim_padded", "warps_k"),
                mma_k_divides_head_dim,
                "the padded head dim is a whole number of MMA k-steps per split-K warp",
            ),
            Constraint(
                "mma_m_divides_rows",
                "structure",
                n("mma", "heads_per_unit", "blocks_per_unit", "head_dim_padded", "warps_m"),
                mma_m_divides_rows,
                "a block's rows of R are whole 16-row MMA tiles per warp (64 per warpgroup)",
            ),
            Constraint(
                "batch_chunk_fills_mma_n",
                "structure",
                n("mma", "batch_chunk"),
                batch_chunk_fills_mma_n,
                "the batch chunk is a multiple of the MMA's N granule, or the whole batch",
            ),
            Constraint(
                "warps_have_work",
                "structure",
                n("mma", "heads_per_unit", "head_dim_padded", "batch_chunk", "warps_m", "warps_k"),
                warps_have_work,
                "every warp of an elementwise block has elements to compute",
            ),
            Constraint(
                "threads_per_block",
                "hardware",
                n("warps_m", "warps_k"),
                threads_per_block,
                f"threads per block ≤ {caps.max_threads_per_block}",
                lambda lay: (lay.threads, caps.max_threads_per_block),
            ),
            Constraint(
                "threads_per_sm",
                "hardware",
                n("warps_m", "warps_k", "blocks_per_sm"),
                threads_per_sm,
                f"threads per SM ≤ {caps.max_threads_per_sm}, blocks per SM ≤ "
                f"{caps.max_blocks_per_sm}",
                lambda lay: (lay.threads * lay.blocks_per_sm, caps.max_threads_per_sm),
            ),
            Constraint(
                "cluster_size_limit",
                "hardware",
                n("tier", "blocks_per_unit"),
                cluster_size_limit,
                f"a cluster has 2..{caps.max_cluster_nonportable} blocks "
                f"(> {caps.max_cluster} is non-portable, opt-in)",
            ),
            Constraint(
                "cluster_fits_gpc",
                "hardware",
                n("tier", "blocks_per_unit", "blocks_per_sm"),
                cluster_fits_gpc,
                f"a cluster fits one GPC (≤ {caps.max_sms_per_gpc} SMs)",
            ),
            Constraint(
                "grid_co_residency",
                "hardware",
                n("tier", "blocks_per_unit", "blocks_per_sm"),
                grid_co_residency,
                f"a grid barrier needs every block of a launch resident, one per SM "
                f"(≤ {caps.sm_count} blocks per unit)",
            ),
            Constraint(
                "registers_per_thread",
                "hardware",
                everything,
                registers_per_thread,
                f"registers per thread ≤ {caps.max_regs_per_thread}",
                lambda lay: (lay.regs_per_thread, caps.max_regs_per_thread),
            ),
            Constraint(
                "registers_per_sm",
                "hardware",
                everything,
                registers_per_sm,
                f"registers of the resident blocks ≤ {regs_sm} per SM",
                lambda lay: (_regs_alloc(lay), regs_sm),
            ),
            Constraint(
                "shared_memory_per_block",
                "hardware",
                everything,
                shared_memory_per_block,
                f"h, Wx-prefetch and split-K buffers ≤ {optin} B opt-in shared memory per block",
                lambda lay: (lay.smem_bytes, optin),
            ),
            Constraint(
                "r_fits_sm_capacity",
                "hardware",
                n("mma", "heads_per_unit", "blocks_per_unit", "head_dim_padded", "blocks_per_sm"),
                r_fits_sm_capacity,
                "the block's R slice is at most its share of the SM's register file plus the "
                "opt-in shared memory",
                lambda lay: (
                    lay.r_bytes,
                    4 * regs_sm // lay.blocks_per_sm + optin,
                ),
            ),
            Constraint(
                "r_fits_on_chip",
                "hardware",
                everything,
                r_fits_on_chip,
                "the block's R slice fits its registers plus the shared memory left over",
                lambda lay: (lay.r_bytes, lay.r_reg_bytes + max(0, optin - lay.smem_fixed)),
            ),
            Constraint(
                "shared_memory_per_sm",
                "hardware",
                everything,
                shared_memory_per_sm,
                f"shared memory of the resident blocks ≤ {smem_sm} B per SM",
                lambda lay: (
                    (lay.smem_bytes + caps.smem_reserved_per_block) * lay.blocks_per_sm,
                    smem_sm,
                ),
            ),
            Constraint(
                "co_residence_only_when_needed",
                "dominance",
                n("tier", "heads_per_unit", "blocks_per_unit", "batch_chunk", "blocks_per_sm"),
                co_residence_only_when_needed,
                "more blocks per SM only when there are more units than fit with fewer",
            ),
            Constraint(
                "padding_minimal",
                "dominance",
                n("mma", "heads_per_unit", "blocks_per_unit", "head_dim_padded"),
                padding_minimal,
                "the head dim is padded no further than the split and the tiles need",
            ),
        ]

    def constraint(self, name: str) -> Constraint:
        for c in self.constraints:
            if c.name == name:
                return c
        raise KeyError(name)

    def violated(self, point: Point, kinds: Iterable[str] | None = None) -> list[str]:
        """Names of the constraints (of the given kinds) that ``point`` violates."""
        wanted = set(kinds) if kinds is not None else None
        return [
            c.name
            for c in self.constraints
            if (wanted is None or c.kind in wanted) and not c.holds(point)
        ]


def _regs_alloc(lay: Layout) -> int:
    """Registers the resident blocks of one SM allocate (per-thread count rounded up)."""
    return _round_up(lay.regs_per_thread, REG_GRANULE) * lay.threads * lay.blocks_per_sm
