"""A sparse R: masks, their check, their pruning, and what the planner needs to know of them.

A mask is a bool tensor of R's shape ``[Gr, NH, D, D]`` (True: kept). A cell call with
``mask=`` runs ``R * mask``: the dropped entries are zeros of R, R's gradient is zero there,
and on CUDA the sparse kernel (``grid_sparse``) keeps only the non-zeros on chip. The planner
needs to know of a mask: the kept fraction of its fullest strip of ``units`` units, over the
rows of R those units own (forward) and over their columns (backward), of its fullest piece of
a strip (``piece_density``), and its entries per block, chunk and slot (``slot_counts``: the
kernels' layout of them, exactly); they are computed on the device once per mask (and again
after the mask changes in place).

``magnitude_mask(R, density)``: the mask keeping the ``density`` largest-magnitude entries of
each gate of each head. ``sparse_r(R, mask)``: a sparse R (COO, CSR, CSC, BSR, BSC) as its
dense form and its stored entries as the mask.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import weakref
from typing import Any

import torch

from rnncc.runtime.validate import _shape
from rnncc.variants.pieces import SlotCounts


def validate_mask(mask: object, R: torch.Tensor | None) -> torch.Tensor:
    """``mask`` checked against ``R``: a bool tensor of R's shape on R's device, or a
    ``ValueError`` naming what differs."""
    if R is None:
        raise ValueError("mask= needs R (the cell has no recurrent matrix, or R was not given)")
    want = _shape(R)
    if not isinstance(mask, torch.Tensor):
        raise ValueError(
            f"mask must be a bool torch.Tensor of shape {want} like R, got {type(mask).__name__}"
        )
    if mask.layout != torch.strided:
        raise ValueError(f"mask must be a dense (strided) bool tensor, got layout {mask.layout}")
    if mask.dtype != torch.bool:
        raise ValueError(f"mask has dtype {mask.dtype}, expected torch.bool (True: kept)")
    if mask.shape != R.shape:
        raise ValueError(f"mask has shape {_shape(mask)}, expected {want} like R [Gr, NH, D, D]")
    if mask.device != R.device:
        raise ValueError(f"mask is on {mask.device}, expected {R.device} like R")
    return mask


#: Torch's compressed sparse layouts (per gate and head: a batched tensor of R's shape, the same
#: number of stored entries or blocks in each matrix), with their compressed and plain indices.
_COMPRESSED = {
    torch.sparse_csr: ("crow_indices", "col_indices"),
    torch.sparse_csc: ("ccol_indices", "row_indices"),
    torch.sparse_bsr: ("crow_indices", "col_indices"),
    torch.sparse_bsc: ("ccol_indices", "row_indices"),
}
#: The layouts whose tensors autograd can give a gradient (CSC, BSR and BSC leaves cannot hold
#: one: torch's engine fails accumulating it).
_GRAD_LAYOUTS = (torch.sparse_coo, torch.sparse_csr)


class _CompressedDense(torch.autograd.Function):
    """A compressed sparse tensor's dense form; its gradient is the dense gradient at the stored
    entries, in the tensor's own layout (``Tensor.sparse_mask``)."""

    @staticmethod
    def forward(ctx: Any, R: torch.Tensor) -> torch.Tensor:
        ctx.pattern = R.detach()
        return R.detach().to_dense()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.sparse_mask(ctx.pattern)


def sparse_r(
    R: torch.Tensor | None, mask: torch.Tensor | None
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(R, mask)`` for a cell call: a sparse ``R`` (COO, or CSR, CSC, BSR or BSC per gate and
    head) becomes its dense form (differentiable for COO and CSR: the gradient is sparse, in
    R's layout, on the stored entries) and the mask of its stored entries (a stored zero is
    kept; a stored block is kept whole); anything else passes unchanged. A ``ValueError`` for a
    sparse R with ``mask=``, or one that requires grad in a layout autograd cannot give a
    gradient."""
    if not isinstance(R, torch.Tensor) or R.layout == torch.strided:
        return R, mask
    if mask is not None:
        raise ValueError(
            "R is a sparse tensor, whose stored entries are the mask: give mask= only with a "
            "dense R"
        )
    if R.requires_grad and R.layout not in _GRAD_LAYOUTS:
        raise ValueError(
            f"R is a {R.layout} tensor that requires grad, and torch cannot give a gradient in "
            "that layout: give R as a sparse COO or CSR tensor (R.to_sparse_coo()), or dense "
            "with mask="
        )
    if R.layout == torch.sparse_coo:
        coo = R.detach().coalesce()
        stored = torch.zeros(R.shape, dtype=torch.bool, device=R.device)
        stored[tuple(coo.indices())] = True
        return R.to_dense(), stored
    if R.layout not in _COMPRESSED:
        raise ValueError(f"R is a {R.layout} tensor: give R dense, or as a sparse COO tensor")
    compressed, plain = (getattr(R, name)() for name in _COMPRESSED[R.layout])
    ones = torch.ones_like(R.values())
    pattern = torch.sparse_compressed_tensor(  # R's own indices: nothing to check
        compressed, plain, ones, R.shape, layout=R.layout, check_invariants=False
    )
    return _CompressedDense.apply(R), pattern.to_dense() != 0


def masked(R: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``R`` with the dropped entries zero; differentiable in ``R`` (zero gradient there)."""
    return torch.where(mask, R, torch.zeros((), dtype=R.dtype, device=R.device))


def _strips(mask: torch.Tensor, units: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``mask`` as the strips of blocks of ``units`` units (the last one padded): R's rows of a
    block's units ``[G, NH, blocks, units, D]`` (forward) and its columns ``[G, NH, D, blocks,
    units]`` (backward), as int32."""
    G, NH, D, _ = mask.shape
    blocks = -(-D // units)
    pad = blocks * units - D
    m = mask.to(torch.int32)
    rows = torch.nn.functional.pad(m, (0, 0, 0, pad)).view(G, NH, blocks, units, D)
    cols = torch.nn.functional.pad(m, (0, pad)).view(G, NH, D, blocks, units)
    return rows, cols


def _fullest(counts: SlotCounts, D: int) -> tuple[float, float]:
    """(strip density, piece density) of a mask's ``slot_counts`` at head dim ``D`` (see the
    two functions below), each kept count divided in Python (float64) by its size."""
    fw, bw, units = counts.forward, counts.backward, counts.units
    G = bw.shape[1]
    strip = max(int(fw.sum((1, 2)).max()), int(bw.sum((1, 2, 3)).max())) / (G * units * D)
    if D % 2:  # no halves: the backward's pieces are a gate's rows whole
        return strip, max(strip, int(bw.sum(3).max()) / (units * D))
    h = D // 2
    fw_half = int(fw.sum(2).max()) / (G * units * h)  # a block's rows, a half of the columns
    bw_half = int(bw.sum(3).max()) / (units * h)  # its columns, a gate's half of the rows
    return strip, max(fw_half, bw_half)


def slot_counts(mask: torch.Tensor, units: int) -> SlotCounts:
    """``mask``'s kept entries per (block of ``units`` units, finest chunk, slot), as the sparse
    kernels' prologue counts them (``rnncc.variants.pieces.SlotCounts``)."""
    rows, cols = _strips(mask, units)
    G, NH, blocks, _, D = rows.shape
    halves = 2 if D % 2 == 0 else 1
    fw = rows.view(G, NH, blocks, units, halves, D // halves).sum(5)  # [G, NH, blocks, units, half]
    fw = fw.permute(1, 2, 4, 0, 3).reshape(NH * blocks, halves, G * units)
    bw = cols.view(G, NH, halves, D // halves, blocks, units).sum(3)  # [G, NH, half, blocks, units]
    bw = bw.permute(1, 3, 0, 2, 4).reshape(NH * blocks, G, halves, units)
    fw_np, bw_np = (t.to(device="cpu", dtype=torch.int64).numpy() for t in (fw, bw))
    key = hashlib.blake2b(fw_np.tobytes() + bw_np.tobytes(), digest_size=16).hexdigest()
    return SlotCounts(units, fw_np, bw_np, key)


def strip_density(mask: torch.Tensor, units: int) -> float:
    """The kept fraction of ``mask``'s fullest strip: blocks of ``units`` units (the last one
    padded), each owning R's rows of its units over every gate (forward) and R's columns of its
    units over every gate row (backward), both ``Gr × units × D`` entries."""
    return _fullest(slot_counts(mask, units), mask.shape[-1])[0]


def piece_density(mask: torch.Tensor, units: int) -> float:
    """The kept fraction of ``mask``'s fullest piece: the parts of a strip (as ``strip_density``)
    that the sparse kernels stage the operand in, at their finest: a forward strip's columns in
    halves, a backward strip's rows a gate and a half at a time (halves only for an even ``D``;
    for an odd one, a gate's rows whole, or the strip where that is fuller). The kernels that
    keep part of the entries in registers hold a share of each such part there, so they must
    know how full the fullest one is."""
    return _fullest(slot_counts(mask, units), mask.shape[-1])[1]


class StripDensities:
    """``strip_density``, ``piece_density`` and ``slot_counts`` of the masks a cell is called
    with, kept while each mask lives and until it changes in place (its version counter moves).
    Keyed by identity: a tensor's ``==`` is elementwise, so no mapping may compare masks."""

    KEPT = 64  # entries past which those of masks no longer alive are dropped

    def __init__(self) -> None:
        self._kept: dict[
            int, tuple[weakref.ref[torch.Tensor], int, int, tuple[float, float, SlotCounts]]
        ] = {}

    def __call__(self, mask: torch.Tensor, units: int) -> tuple[float, float, SlotCounts]:
        """(strip density, piece density, slot counts) of ``mask`` for blocks of ``units``
        units."""
        found = self._kept.get(id(mask))
        version = mask._version
        if found is not None and found[0]() is mask and found[1:3] == (version, units):
            return found[3]
        counts = slot_counts(mask, units)
        strip, piece = _fullest(counts, mask.shape[-1])
        densities = (strip, max(strip, piece), counts)  # equal fractions may round apart
        if len(self._kept) >= self.KEPT:
            self._kept = {k: v for k, v in self._kept.items() if v[0]() is not None}
        self._kept[id(mask)] = (weakref.ref(mask), version, units, densities)
        return densities


def is_density(x: object) -> bool:
    """Whether ``x`` is a kept fraction: a real number in (0, 1] (numpy's float32 and
    Fraction too, which are no Python float; not a bool)."""
    return not isinstance(x, bool) and isinstance(x, numbers.Real) and 0 < float(x) <= 1


def magnitude_mask(
    R: torch.Tensor, density: float, among: torch.Tensor | None = None
) -> torch.Tensor:
    """The mask keeping the ``ceil(density × D × D)`` entries of largest magnitude of each
    (gate, head) of ``R`` ``[Gr, NH, D, D]`` (ties: the first in row-major order); with
    ``among`` (a mask of R's shape), only among its entries, whatever R holds elsewhere (an
    optimizer's momentum can move entries a mask drops)."""
    if not 0.0 < density <= 1.0:
        raise ValueError(f"density must be in (0, 1], got {density}")
    G, NH, D, _ = R.shape
    keep = math.ceil(density * D * D)
    score = R.detach().abs()
    if among is not None:
        score = torch.where(among, score, -1.0)
    flat = score.reshape(G, NH, D * D)
    mask = torch.zeros_like(flat, dtype=torch.bool)
    mask.scatter_(2, flat.topk(keep, dim=2, sorted=False).indices, True)
    mask = mask.view(G, NH, D, D)
    return mask if among is None else mask & among
