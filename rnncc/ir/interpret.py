"""The torch interpreter of the IR: the executable definition of every op.

Input: root nodes and a value for every leaf they reach (``(op, name)`` → tensor). Output:
one tensor per root, computed with each op's ``ref`` from the op table, on the leaves' device
and in their dtype. Constants become 0-dim tensors of that dtype, so they never promote.
This is the oracle of every numerical test and the engine of the reference backend.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from rnncc.errors import InternalError
from rnncc.ir.node import Node, toposort
from rnncc.ir.ops import OPS

LeafKey = tuple[str, str]


def evaluate(
    roots: Sequence[Node],
    leaves: Mapping[LeafKey, torch.Tensor],
    *,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
) -> list[torch.Tensor]:
    """Evaluate ``roots`` over ``leaves``; see the module docstring."""
    values: dict[Node, torch.Tensor] = {}
    for node in toposort(list(roots)):
        if node.op == "const":
            values[node] = torch.tensor(node.arg, dtype=dtype, device=device)
            continue
        if not node.src:
            try:
                values[node] = leaves[(node.op, node.arg)]
            except KeyError:
                raise InternalError(f"no value bound for leaf {node.op} {node.arg!r}") from None
            continue
        row = OPS[node.op]
        args = [values[s] for s in node.src]
        assert row.ref is not None
        values[node] = row.ref(*args, node.arg) if node.op == "pow" else row.ref(*args)
    return [values[r] for r in roots]
