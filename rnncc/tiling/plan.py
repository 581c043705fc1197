"""The plan: the variant that runs a problem, its parameters, its launch and its cost.

``Plan`` is what the solver returns and what the runtime launches: ``build`` is the record the
variant's library is built from (its compile-time constants), ``launch`` the kernels, blocks
and buffers for this problem's batch, ``cost`` the predicted µs per step. ``explain()`` says
it in words, with the other variants' best costs or the constraints that rule them out;
``as_dict()`` is its JSON form.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rnncc.tiling.hardware import HardwareCaps
from rnncc.tiling.problem import Problem
from rnncc.variants import BY_NAME, VARIANTS, Cost, KernelLaunch, Launch, Variant

#: A hardware constraint using this share of its limit or more is reported as binding.
BINDING_SHARE = 0.9


def other_dtypes(problem: Problem, variants: Iterable[Variant] = VARIANTS) -> list[str]:
    """A line per group of ``variants`` that do not store the problem's dtype: their names
    and the dtypes they store (so that a plan or an error says why they are not there)."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for v in variants:
        if problem.dtype not in v.dtypes:
            groups.setdefault(tuple(v.dtypes), []).append(v.name)
    return [
        f"{', '.join(names)}: store {' and '.join(dtypes)} only, not {problem.dtype}"
        for dtypes, names in groups.items()
    ]


@dataclass(frozen=True)
class Alternative:
    """Another variant for the same problem: its best forward µs per step, or (when no point
    of it is feasible) the constraints that rule it out."""

    variant: str
    forward_us: float | None
    binding: tuple[str, ...] = ()


def _params(point: tuple[tuple[str, Any], ...], eq: str = "=") -> str:
    """A point's parameters as ``n_tiles=1, unit_tiles=2`` (``eq`` between name and value)."""
    return ", ".join(f"{k}{eq}{v}" for k, v in point)


@dataclass(frozen=True)
class Plan:
    problem: Problem
    caps: HardwareCaps
    variant: str
    point: tuple[tuple[str, Any], ...]  # the variant's parameters, by name (the forward's)
    build: dict[str, Any]
    launch: Launch
    cost: Cost
    usage: tuple[tuple[str, float, float], ...]  # (constraint, used, limit)
    alternatives: tuple[Alternative, ...] = ()
    #: the backward's parameters: the forward's point, or the variant's point of the cheapest
    #: backward (``launch.backward`` and ``cost.backward_us`` are that point's)
    backward_point: tuple[tuple[str, Any], ...] = ()

    @property
    def fused(self) -> bool:
        return BY_NAME[self.variant].host == "fused"

    @property
    def binding(self) -> tuple[str, ...]:
        """Constraints at or above ``BINDING_SHARE`` of their limit."""
        return tuple(n for n, used, lim in self.usage if lim and used >= BINDING_SHARE * lim)

    def summary(self) -> str:
        """One line: the variant, its parameters and its launch shape — what the runtime
        launches for this problem (the backward's too where it runs another point)."""
        params = _params(self.point)
        head = self.variant + (f" ({params})" if params else "")
        if self.launch.forward is None:
            return f"{head}: per step a matrix product and a pointwise kernel"
        line = f"{head}: forward {self.launch.forward.describe()}"
        if self.backward_point != self.point and self.launch.backward is not None:
            line += f"; backward ({_params(self.backward_point)}) {self.launch.backward.describe()}"
        return line

    def launched(self) -> dict[str, Any]:
        """The variant and the launch numbers (what a test compares with what ran)."""
        return {"variant": self.variant, "launch": self.launch.as_list()}

    def as_dict(self) -> dict[str, Any]:
        def kernel(k: KernelLaunch | None) -> dict[str, Any] | None:
            if k is None:
                return None
            return {
                "kernel": k.kernel,
                "threads": k.threads,
                "smem": k.smem,
                "grid": list(k.grid),
                "launches": k.launches,
            }

        return {
            "problem": self.problem.as_dict(),
            "device": self.caps.name,
            "sm_count": self.caps.sm_count,
            "variant": self.variant,
            "point": dict(self.point),
            "backward_point": dict(self.backward_point),
            "build": self.build,
            "launch": {
                "forward": kernel(self.launch.forward),
                "backward": kernel(self.launch.backward),
                "exchange_words": self.launch.exchange_words,
                "exchange_buffer_words": self.launch.exchange_buffer_words,
                "l2_from": self.launch.l2_from,
                "l2_bytes": self.launch.l2_bytes,
            },
            "cost": self.cost.as_dict(),
            "usage": [{"constraint": n, "used": u, "limit": lim} for n, u, lim in self.usage],
            "binding": list(self.binding),
            "alternatives": [
                {"variant": a.variant, "forward_us": a.forward_us, "binding": list(a.binding)}
                for a in self.alternatives
            ],
            # why the variants missing from the alternatives are missing (explain()'s lines)
            "other_dtypes": other_dtypes(self.problem),
        }

    def explain(self) -> str:
        p, caps, c = self.problem, self.caps, self.cost
        lines = [
            f"plan for {p.describe()} on {caps.name} ({caps.arch}, {caps.sm_count} SMs)",
            f"  variant     {self.variant}: {BY_NAME[self.variant].summary}",
            f"  launches    {self.summary()}",
        ]
        add = lines.append
        if self.point:
            params = _params(self.point, " = ")
            if self.backward_point != self.point:  # the backward's own cheapest point
                params += "; backward " + _params(self.backward_point, " = ")
            add("  parameters  " + params)
        for name, k in (("forward", self.launch.forward), ("backward", self.launch.backward)):
            if k is not None:
                add(f"  {name:<11} {k.describe()}")
        if self.launch.exchange_words:
            add(
                f"  exchange    {self.launch.exchange_words} values per (head, batch row); "
                f"{self.launch.exchange_buffer_words * 4} B for B={p.batch}"
            )
        if self.launch.l2_bytes:
            fw, bw = self.build.get("fw_l2_claim"), self.build.get("bw_l2_claim")
            how = (
                f"persisting lines: {fw / 1000:g} of L2's set-aside forward, {bw / 1000:g} backward"
                if fw is not None and bw is not None
                else "persisting"
            )
            add(
                f"  L2 window   {self.launch.l2_bytes} B of the streamed R (the buffer's words "
                f"from {self.launch.l2_from}) kept in L2 across steps ({how})"
            )
        if self.usage:
            usage = ", ".join(f"{n} {u / lim:.0%}" for n, u, lim in self.usage if lim)
            add(f"  usage       {usage}")
            add(f"  binding     {', '.join(self.binding) or 'none (all below 90 %)'}")
        terms = " + ".join(f"{n} {us:.3f}" for n, us in c.terms)
        waves = f"{c.waves} × " if c.waves > 1 else ""
        add(
            f"  cost        {c.forward_us:.3f} µs/step forward ({waves}{terms}), "
            f"{c.backward_us:.3f} backward"
        )
        for a in self.alternatives:
            if a.forward_us is not None:
                add(f"  other       {a.variant}: feasible, {a.forward_us:.3f} µs/step forward")
            else:
                add(f"  other       {a.variant}: ruled out by {', '.join(a.binding)}")
        for line in other_dtypes(p):
            add(f"  other       {line}")
        return "\n".join(lines)
