"""What every kernel variant declares: parameters, named constraints, cost, launch, render.

A variant is one kernel that exists (its CUDA is in ``templates/``). The solver
(``rnncc.tiling.solve``) enumerates the points of each variant's parameter domains that
satisfy its constraints, asks the variant for the cost and the launch of each, and ranks
them; the runtime builds the variant's library from ``build`` and launches what ``launch``
says. So nothing else decides what runs, and no size is worked out twice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # the solver's types; variants sit below rnncc.tiling and never import it
    from rnncc.codegen.source import GeneratedSource
    from rnncc.ir.cell import BackwardCell, Cell
    from rnncc.tiling.hardware import HardwareCaps
    from rnncc.tiling.problem import Problem

#: Batch rows of a block-tier block, and of a grid-tier block's batch tile (the mma's n).
BATCH_CHUNK = 8
#: A point: the value of each of a variant's parameters, by name.
Point = Mapping[str, Any]
#: A variant's compile-time constants (JSON data): the traits its kernels are built with.
Build = Mapping[str, Any]


@dataclass(frozen=True)
class Constraint:
    """A named condition a point must meet. ``test(problem, caps, *values)`` reads the values
    of ``variables`` (none: the condition is on the problem alone); ``usage(problem, caps,
    point)`` says (used, limit) for a hardware limit, so that a plan can say how tight it is."""

    name: str
    doc: str
    test: Callable[..., bool]
    variables: tuple[str, ...] = ()
    usage: Callable[[Problem, HardwareCaps, Point], tuple[float, float]] | None = None

    def holds(self, problem: Problem, caps: HardwareCaps, point: Point) -> bool:
        return bool(self.test(problem, caps, *(point[v] for v in self.variables)))


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel's launches for a problem: which of the library's kernels, its block, its
    dynamic shared memory, the blocks of one launch and how many launches run one after the
    other (each launch covers a share of the heads and batch chunks)."""

    kernel: int
    threads: int
    smem: int
    grid: tuple[int, int, int]
    launches: int = 1

    def as_list(self) -> list[int]:
        """The numbers the host loop passes to the library's entry point (``rnncc_launch``)."""
        return [self.kernel, self.threads, self.smem, *self.grid]

    def describe(self) -> str:
        x, y, z = self.grid
        shape = f"{x}×{y}×{z} blocks of {self.threads} threads"
        smem = f", {self.smem} B dynamic shared memory" if self.smem else ""
        times = f", {self.launches} launches" if self.launches > 1 else ""
        return f"kernel {self.kernel}: {shape}{smem}{times}"


@dataclass(frozen=True)
class Launch:
    """The forward's and the backward's launches, and the grid tier's exchange: 16-bit values
    per (head, batch row), and the 32-bit words of the buffer the host allocates (0: none).
    ``l2_bytes`` bytes of that buffer from its word ``l2_from`` on (the part of R a streaming
    kernel reads every step) are kept in L2 by a persisting access-policy window on the
    launches (0: no window)."""

    forward: KernelLaunch | None
    backward: KernelLaunch | None
    exchange_words: int = 0
    exchange_buffer_words: int = 0
    l2_from: int = 0
    l2_bytes: int = 0

    def as_list(self) -> list[int]:
        """``[exchange values, buffer words, L2 window's first word, its bytes, forward (6),
        backward (6)]`` as the host loop takes them; empty where the variant's kernels are
        launched per step (stepwise)."""
        if self.forward is None or self.backward is None:
            return []
        return [
            self.exchange_words,
            self.exchange_buffer_words,
            self.l2_from,
            self.l2_bytes,
            *self.forward.as_list(),
            *self.backward.as_list(),
        ]


@dataclass(frozen=True)
class Cost:
    """Estimated µs per step, forward and backward; ``terms`` (name, µs) add up to the
    forward's step of one wave of blocks."""

    terms: tuple[tuple[str, float], ...]
    waves: int
    forward_us: float
    backward_us: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "terms": dict(self.terms),
            "waves": self.waves,
            "forward_us": self.forward_us,
            "backward_us": self.backward_us,
        }


class Variant:
    """A kernel variant; subclasses fill in the class attributes and the methods."""

    name: ClassVar[str]
    summary: ClassVar[str]  # one line: what the kernel is
    dtypes: ClassVar[tuple[str, ...]]  # storage dtypes it runs ("fp32", "fp16", "bf16")
    host: ClassVar[str]  # the host loop's entry points that launch it: "fused" or "stepwise"
    constraints: ClassVar[tuple[Constraint, ...]] = ()

    def domains(self, problem: Problem, caps: HardwareCaps) -> dict[str, tuple[Any, ...]]:
        """Each parameter's values; none by default (one point, ``{}``)."""
        return {}

    def build(self, problem: Problem, caps: HardwareCaps | None = None) -> dict[str, Any]:
        """The compile-time constants of the kernels that run ``problem`` on the device of
        ``caps`` (None: an H100's arch) (JSON data): the library is keyed by them, and its
        kernels are built with them."""
        raise NotImplementedError

    def launch(self, problem: Problem, caps: HardwareCaps, point: Point) -> Launch:
        raise NotImplementedError

    def cost(self, problem: Problem, caps: HardwareCaps, point: Point) -> Cost:
        raise NotImplementedError

    def render(self, cell: Cell, bwd: BackwardCell, build: Build) -> GeneratedSource:
        """The CUDA source of the library that ``build`` describes, for ``cell``."""
        raise NotImplementedError

    def runs_timeline(self, build: Build) -> bool:
        """Whether the kernels of ``build`` take per-row lengths and the reverse direction
        (``Problem.timeline``)."""
        return bool(build.get("timeline"))

    def library_name(self, cell_name: str, build: Build) -> str:
        d = build.get("D")
        name = f"rnncc_{cell_name}_{self.name}" + (f"_d{d}" if d is not None else "")
        name += f"_{build['dtype']}" if "dtype" in build else ""
        return name + ("_timeline" if build.get("timeline") else "")


def timeline_record(problem: Problem) -> dict[str, Any]:
    """The part of a fused build record that says its kernels take per-row lengths and the
    reverse direction: ``{"timeline": True}`` where the problem needs them, else nothing, so
    that the kernels of full-length forward calls are built (and cached) without them."""
    return {"timeline": True} if problem.timeline else {}


def waves(units: int, slots: int) -> int:
    """Rounds of ``units`` blocks (or groups of blocks) when ``slots`` run at once."""
    return -(-units // max(1, slots))


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
