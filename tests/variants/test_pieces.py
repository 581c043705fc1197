"""The sparse kernels' layout of a block's entries (templates/grid_sparse.cuh: gather,
distribute, product, fold), transcribed loop for loop in Python: every entry is run once,
every piece's sums are stored once a chunk, the slots' sums are the masked product, and
rnncc.variants.pieces (the planner's model of the layout) gives the steps and shared memory
it takes. The kernels themselves run in
tests/gpu/test_sparse_gpu.py."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from rnncc.variants import pieces


def kernel_layout(mask, chunks, warps, rounds, reg_steps, banks):
    """What one block's prologue lays out of ``mask`` [slots, chunks * cols]: per (chunk, warp)
    its steps, each a list of 32 entries (slot, column) or None, each round's end and its
    lanes' (slot, piece); and per chunk each slot's first piece (and the pieces' end)."""
    slots, width = mask.shape
    cols = width // chunks
    P = 32 * warps * rounds
    out, firsts = {}, []
    for c in range(chunks):
        # gather: a (chunk, slot)'s entries by bank group, in column order within one
        ent = [
            [(s, j) for g in range(banks) for j in range(g, cols, banks) if mask[s, c * cols + j]]
            for s in range(slots)
        ]
        n = [len(e) for e in ent]
        total, nonempty = sum(n), sum(1 for x in n if x)
        count, rem, left = [0] * slots, [-1] * slots, P
        for s in range(slots):
            if n[s]:
                count[s] = 1 + n[s] * (P - nonempty) // total
                rem[s] = n[s] * (P - nonempty) % total
                left -= count[s]
            elif s == 0 and nonempty == 0:
                count[s] = P
        for s in range(slots):
            rank = sum(1 for t in range(slots) if rem[t] > rem[s] or (rem[t] == rem[s] and t < s))
            if rem[s] >= 0 and rank < left:
                count[s] += 1
        first = list(itertools.accumulate(count, initial=0))
        assert first[-1] == P
        firsts.append(first)
        piece = [(s, k) for s in range(slots) for k in range(count[s])]
        length = [(n[s] - k + count[s] - 1) // count[s] if n[s] > k else 0 for s, k in piece]
        order = sorted(range(P), key=lambda i: (-length[i], i))
        lanes = {}
        ends = {}
        for q, i in enumerate(order):
            r, lane = divmod(q, 32)
            kk, wi = divmod(r, warps)
            w = warps - 1 - wi if (c * rounds + kk) % 2 else wi
            lanes[(w, kk, lane)] = (*piece[i], i)
            if lane == 0:
                ends[(w, kk)] = length[i]
        blocks = -(-reg_steps // 4) * 4
        for w in range(warps):
            run, round_ends = 0, []
            for kk in range(rounds):
                run += ends[(w, kk)]
                if run <= blocks:
                    run = -(-run // 4) * 4
                round_ends.append(run)
            steps = [[None] * 32 for _ in range(run)]
            j0 = 0
            for kk in range(rounds):
                for lane in range(32):
                    s, k, _ = lanes[(w, kk, lane)]
                    p, a = count[s], 0
                    nxt, bound, live = [0] * banks, [0] * banks, 0
                    for g in range(banks):
                        b = a + sum(1 for e in ent[s] if e[1] % banks == g)
                        nxt[g] = k + (-(-(a - k) // p) if a > k else 0) * p
                        bound[g] = b
                        if nxt[g] < b:
                            live |= 1 << g
                        a = b
                    for i in range(round_ends[kk] - j0):
                        if live:
                            start = (i + lane) % banks
                            g = next(
                                g
                                for g in ((start + t) % banks for t in range(banks))
                                if live >> g & 1
                            )
                            steps[j0 + i][lane] = ent[s][nxt[g]]
                            nxt[g] += p
                            if nxt[g] >= bound[g]:
                                live &= ~(1 << g)
                j0 = round_ends[kk]
            slots_of = [[lanes[(w, kk, lane)][::2] for lane in range(32)] for kk in range(rounds)]
            out[(c, w)] = (steps, round_ends, slots_of)
    return out, firsts


def store(parts, lanes, acc):
    """A round's end: lane l's sums to its piece's place (once a chunk), then zeros."""
    for lane, (_, i) in enumerate(lanes):
        assert np.isnan(parts[i])  # each piece stored once
        parts[i] = acc[lane]
    acc[:] = 0


@pytest.mark.parametrize(
    "slots, chunks, warps, rounds, reg_steps, banks, density",
    [
        (18, 2, 4, 1, 0, 16, 0.3),  # shared memory only
        (40, 1, 4, 2, 9, 16, 0.2),  # registers: a block of the last register and first shared steps
        (12, 4, 2, 3, 8, 8, 0.5),  # 8 batch rows: 8 bank groups
        (6, 1, 2, 1, 0, 16, 0.02),  # pieces with no entries
        (5, 2, 2, 1, 4, 16, 0.0),  # no entries at all
    ],
)
def test_every_entry_runs_once_into_its_slot_and_the_model_counts_the_steps(
    slots, chunks, warps, rounds, reg_steps, banks, density
):
    rng = np.random.default_rng(slots)
    cols = 256
    mask = rng.random((slots, chunks * cols)) < density
    value = rng.standard_normal(mask.shape) * mask
    h = rng.standard_normal(chunks * cols)
    layout, firsts = kernel_layout(mask, chunks, warps, rounds, reg_steps, banks)
    parts = np.full((chunks, 32 * warps * rounds), np.nan)  # the pieces' sums, a chunk's at a time
    sums, seen = np.zeros(slots), []
    steps = np.zeros((1, chunks, warps), np.int64)
    for (c, w), (rows, round_ends, slots_of) in layout.items():
        steps[0, c, w] = len(rows)
        acc, kk = np.zeros(32), 0
        for j, row in enumerate(rows):
            for lane, e in enumerate(row):
                if e is not None:
                    s, col = e
                    assert s == slots_of[kk][lane][0]  # a lane's entries are its piece's slot's
                    seen.append((s, c * cols + col))
                    acc[lane] += value[s, c * cols + col] * h[c * cols + col]
            if j + 1 == round_ends[kk]:  # a round's end: each lane's sums to its piece's place
                store(parts[c], slots_of[kk], acc)
                kk += 1
        while kk < rounds:  # the rounds of empty pieces, after the others
            assert round_ends[kk] == len(rows)
            store(parts[c], slots_of[kk], acc)
            kk += 1
    assert sorted(seen) == sorted(zip(*np.nonzero(mask)))
    for c, first in enumerate(firsts):  # fold: a slot's pieces are first[s] to first[s + 1]
        assert not np.isnan(parts[c]).any()
        sums += [parts[c, first[s] : first[s + 1]].sum() for s in range(slots)]
    np.testing.assert_allclose(sums, value @ h, rtol=0, atol=1e-12)
    counts = np.stack([mask[:, c * cols : (c + 1) * cols].sum(1) for c in range(chunks)])[None]
    assert (pieces.steps(counts, warps, rounds, reg_steps) == steps).all()
    shared = int((32 * np.maximum(0, steps - reg_steps)).sum())
    assert pieces.shared_entries(counts, warps, rounds, reg_steps) == shared


def test_a_step_of_long_pieces_reads_the_bank_groups_evenly():
    # 32 lanes prefer group (step + lane) % 16 while their pieces have entries there: a step
    # reads each group about twice (2 wavefronts of 8-byte loads), where a lane walking its
    # piece in column order would pile up on a few groups
    rng = np.random.default_rng(0)
    mask = rng.random((72, 2304)) < 0.3
    layout = kernel_layout(mask, 1, 4, 1, 0, 16)
    loads = [
        max(np.bincount([e[1] % 16 for e in row if e is not None], minlength=16))
        for rows, _, _ in layout[0].values()
        for row in rows
    ]
    assert np.mean(loads) < 3.0
