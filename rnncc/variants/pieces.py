"""How ``grid_sparse``'s kernels lay a block's entries out, computed on the host from a mask.

A block's entries of one chunk (its strip's columns in the chunk) are cut into exactly
``32 × warps × rounds`` pieces: a piece for each slot with entries, the rest in proportion to
the slots' entries (largest remainder); slot ``s`` of ``n`` entries in ``p`` pieces has ``n mod
p`` pieces of ``n // p + 1`` entries and the rest of ``n // p``. The pieces, longest first, go
32 at a time to the warps' rounds in a snake (over the warps, and over the chunks' rounds), and
a round is as long as its longest piece; a round that ends among a warp's first ``reg_steps``
steps (those held in registers) is rounded up to whole blocks of 4 steps. A warp's steps of a
chunk are its rounds' lengths; those past ``reg_steps`` take 32 entries of shared memory each.

``SlotCounts`` holds a mask's entries per (block, finest chunk, slot), from which ``steps`` and
``shared_entries`` give exactly what the kernels' prologue will find (``templates/
grid_sparse.cuh``: ``distribute``), so the plan knows a mask's entries fit before a launch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Steps of a block (their operand loads in flight together): rounds that end among the
#: register steps are whole blocks.
BLOCK = 4


@dataclass(frozen=True, eq=False)
class SlotCounts:
    """A mask's kept entries per block of ``units`` units (over heads, then blocks) at the
    finest chunks the sparse kernels stage the operand in: ``forward[block, half, slot]`` (R's
    rows of the block's units, slot = gate × units + unit, by halves of the columns) and
    ``backward[block, gate, half, unit]`` (R's columns of the block's units, by gate and half of
    its rows). ``halves`` is 2 for an even head dim, else 1. ``key``: equal for equal counts."""

    units: int
    forward: np.ndarray
    backward: np.ndarray
    key: str

    def chunks(self, backward: bool, gates: int, split: int) -> np.ndarray:
        """``[block, chunk, slot]`` for a side whose operand is staged ``gates`` gates' rows at a
        time (backward) in ``split`` parts, chunks in the kernel's order."""
        if not backward:
            fw: np.ndarray = self.forward
            return fw if split == fw.shape[1] else fw.sum(1, keepdims=True)
        bw: np.ndarray = self.backward
        blocks, gr, halves, units = bw.shape
        if gates == gr and split == 1:
            return np.asarray(bw.sum((1, 2))[:, None, :])
        if gates == 1 and split == halves:
            return bw.reshape(blocks, gr * halves, units)
        if gates == 1 and split == 1:
            return np.asarray(bw.sum(2))
        raise ValueError(f"no chunks of {gates} gates in {split} parts")


def steps(counts: np.ndarray, warps: int, rounds: int, reg_steps: int) -> np.ndarray:
    """Each warp's steps per chunk, ``[block, chunk, warp]``, of a side's ``counts``
    ``[block, chunk, slot]``."""
    blocks, chunks, slots = counts.shape
    pieces = 32 * warps * rounds
    n = counts.reshape(blocks * chunks, slots).astype(np.int64)
    total = n.sum(1, keepdims=True)
    nonempty = (n > 0).sum(1, keepdims=True)
    share = n * (pieces - nonempty)
    whole = np.where(n > 0, 1 + share // np.maximum(total, 1), 0)
    rem = np.where(n > 0, share % np.maximum(total, 1), -1)
    left = pieces - whole.sum(1, keepdims=True)
    order = np.argsort(-rem * slots + np.arange(slots), axis=1, kind="stable")
    rank = np.argsort(order, axis=1)  # by remainder, largest first, then by slot
    count = whole + ((rank < left) & (rem >= 0))
    count[nonempty[:, 0] == 0, 0] = pieces  # no entries: every piece empty
    p = np.maximum(count, 1)
    long, short = n // p + 1, n // p  # n mod p pieces of n // p + 1 entries, the rest n // p
    lengths = np.stack([long, short], 2).reshape(-1)
    reps = np.stack([n % p, count - n % p], 2).reshape(-1)
    sorted_lengths = -np.sort(-np.repeat(lengths, reps).reshape(blocks * chunks, pieces), axis=1)
    # each round's longest piece, [block, chunk, round of a warp, its place in the snake]
    longest = sorted_lengths[:, ::32].reshape(blocks, chunks, rounds, warps)
    out = np.zeros((blocks, chunks, warps), np.int64)
    regs = -(-reg_steps // BLOCK) * BLOCK
    for c in range(chunks):
        run = np.zeros((blocks, warps), np.int64)
        for kk in range(rounds):
            by_warp = longest[:, c, kk, :]
            if (c * rounds + kk) % 2:
                by_warp = by_warp[:, ::-1]
            run = run + by_warp
            run = np.where(run <= regs, -(-run // BLOCK) * BLOCK, run)
        out[:, c, :] = run
    return out


def shared_entries(counts: np.ndarray, warps: int, rounds: int, reg_steps: int) -> int:
    """The most entries a block of ``counts`` keeps in shared memory: its warps' steps past
    ``reg_steps`` of every chunk, 32 entries each."""
    s = steps(counts, warps, rounds, reg_steps)
    return int((32 * np.maximum(0, s - reg_steps)).sum((1, 2)).max())
