"""grid_sparse on the CPU side: when the planner takes it, what its plan sizes, and the masks
a cell call takes (rnncc.runtime.sparsity). The kernels run in tests/gpu/test_sparse_gpu.py;
they compile in test_render.py's nvcc test (whose static_assert checks the plan's shared
memory against the kernel's layout)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

import rnncc
from rnncc.runtime.sparsity import (
    StripDensities,
    magnitude_mask,
    piece_density,
    slot_counts,
    sparse_r,
    strip_density,
    validate_mask,
)
from rnncc.tiling import Problem, caps_for_arch
from rnncc.tiling.solve import diagnose, solve
from rnncc.variants import BY_NAME, pieces
from rnncc.variants import grid_sparse as gs
from rnncc.variants.grid_mma import smem_limit

H100 = caps_for_arch("h100")
SPARSE = BY_NAME["grid_sparse"]
LSTM = rnncc.load_builtin("lstm")


def lstm(D: int, B: int = 4, density: float = 0.3, **kw) -> Problem:
    return Problem.from_cell(LSTM.ir, heads=1, head_dim=D, batch=B, density=density, **kw)


def ruled_out(p: Problem) -> list[str]:
    return [c.name for c in SPARSE.constraints if not c.holds(p, H100, {})]


def threads(p: Problem) -> int | None:
    """The threads of the layout that holds ``p``'s entries (None: none does)."""
    found = gs.layout(p, gs.block_units(p.head_dim, H100.sm_count), smem_limit(H100))
    return None if found is None else found[0].threads


def test_planned_for_masks_that_fit_and_only_those():
    assert ruled_out(lstm(256, density=1.0)) == ["sparse_r"]
    assert ruled_out(lstm(2304, timeline=True)) == ["full_length_only"]
    assert solve(lstm(2304), H100).variant == "grid_sparse"
    # At 30 % a block of 18 units holds 4 x 18 x 2304 x 0.3 entries (and their rounds' padding)
    # in 227 KiB of shared memory, up to 2376 units; past that its lanes' registers hold part
    # of them, up to 3074.
    assert threads(lstm(2376)) == gs.THREADS and threads(lstm(2378)) == gs.REG_THREADS
    assert not ruled_out(lstm(3074)) and ruled_out(lstm(3076)) == ["entries_fit_on_chip"]
    # At 10 %: 3960 in shared memory; 5280 (2.5 times the dense kernels' 2112) with registers.
    assert threads(lstm(3960, density=0.1)) == gs.THREADS
    assert threads(lstm(3962, density=0.1)) == gs.REG_THREADS
    assert not ruled_out(lstm(5280, density=0.1))
    assert ruled_out(lstm(5282, density=0.1)) == ["entries_fit_on_chip"]
    assert diagnose(SPARSE, lstm(4096, density=0.5), H100) == ["entries_fit_on_chip"]


def test_the_operand_is_staged_in_halves_only_where_the_entries_need_the_room():
    for density, split in ((0.3, 1), (0.301, 1), (0.302, 2), (0.31, 2)):
        build = SPARSE.build(lstm(2304, density=density), H100)
        assert (build["threads"], build["fw_split"], build["bw_split"]) == (
            gs.THREADS,
            split,
            split,
        )
        assert build["fw_entries"] >= gs.strip_entries(lstm(2304, density=density), 18)
    # past halves at 512 threads, halves at 256 (whose pieces' sums take half the room)
    build = SPARSE.build(lstm(2304, density=0.32), H100)
    assert (build["threads"], build["fw_split"], build["fw_reg_steps"]) == (gs.REG_THREADS, 2, 0)
    # past those, registers (the operands whole again); past registers, nothing
    build = SPARSE.build(lstm(2304, density=0.33), H100)
    assert (build["threads"], build["fw_split"], build["fw_reg_steps"]) == (gs.REG_THREADS, 1, 152)
    assert ruled_out(lstm(2304, density=0.56)) == ["entries_fit_on_chip"]
    # all of dg staged at once: no halves
    assert SPARSE.build(lstm(2304, density=0.1), H100)["bw_split"] == 1
    # an odd head dim has no halves
    assert SPARSE.build(lstm(2305, density=0.32), H100)["fw_split"] == 1


def test_register_steps_hold_what_shared_memory_cannot_of_the_fullest_piece():
    # LSTM 5280, 10 %: h in halves (2 chunks) and dg a gate and a half at a time (8 chunks),
    # REG_ENTRIES registers a thread shared evenly by the chunks
    p = lstm(5280, density=0.1)
    build = SPARSE.build(p, H100)
    assert (build["units"], build["threads"]) == (40, gs.REG_THREADS)
    assert (build["fw_split"], build["bw_split"], build["bw_gates"]) == (2, 2, 1)
    assert (build["fw_reg_steps"], build["bw_reg_steps"]) == (152 // 2, 144 // 8)
    for backward, key in ((False, "fw_entries"), (True, "bw_entries")):
        gates, split = (1, 2)
        need = gs.shared_entries(
            p,
            40,
            backward,
            gates,
            split,
            gs.REG_THREADS,
            build[key.replace("entries", "reg_steps")],
        )
        assert need <= build[key] < gs.strip_entries(p, 40)
    # the pieces decide: a mask whose fullest piece is fuller than its fullest strip needs more
    uneven = dataclasses.replace(p, piece_density=0.12)
    assert gs.shared_entries(uneven, 40, True, 1, 2, gs.REG_THREADS, 18) > gs.shared_entries(
        p, 40, True, 1, 2, gs.REG_THREADS, 18
    )
    assert ruled_out(uneven) == ["entries_fit_on_chip"]
    # 8 batch rows: fewer registers a thread
    assert (
        SPARSE.build(lstm(2304, B=16, density=0.45), H100)["fw_reg_steps"]
        == gs.REG_ENTRIES[8, False]
    )


def test_the_plan_follows_the_measured_h100_pairs():
    # benchmarks/results/sparse-parts-h100-2026-11-27.txt and sparse-h100-2026-11-27e.json
    # (random masks, B = 4 unless said, ms forward): sparse faster at 30 % (7.2-7.3 against
    # grid_stream's 7.5-8.8 on R * mask) and at 10 % (4.7-4.9), and at 3840 units (7.9 against
    # 29.8); slower where its entries need registers (2304 units, 45 %: 11.4) and at 8 batch
    # rows (GRU, B = 16, 30 %: 15.9 against 11.4), and at 256 threads without register entries
    # (a 32 % strip: 9.4-9.9 against 8.7-8.8), where the 512-thread halves (31.6 %: 8.3-8.4) are
    # faster
    assert solve(lstm(2304, density=0.3), H100).variant == "grid_sparse"
    assert solve(lstm(2304, density=0.31), H100).variant == "grid_sparse"
    assert threads(lstm(2304, density=0.32)) == gs.REG_THREADS
    assert solve(lstm(2304, density=0.32), H100).variant == "grid_stream"
    assert solve(lstm(2304, density=0.1), H100).variant == "grid_sparse"
    assert solve(lstm(3840, density=0.1), H100).variant == "grid_sparse"
    assert solve(lstm(2304, density=0.45), H100).variant == "grid_stream"
    gru = Problem.from_cell(
        rnncc.load_builtin("gru").ir, heads=1, head_dim=2304, batch=16, density=0.3
    )
    assert solve(gru, H100).variant == "grid_stream"


T_STEPS = 1024
#: H100 times of grid_sparse (benchmarks/results/sparse-parts-h100-2026-11-27.txt, the final
#: tree; random masks, T = 1024): (cell, units, batch, density, forward ms, forward and
#: backward ms).
MEASURED = [
    ("lstm", 2304, 4, 0.1, 4.949, 11.370),
    ("lstm", 2304, 4, 0.2, 5.951, 13.608),
    ("lstm", 2304, 4, 0.3, 7.326, 18.854),
    ("lstm", 2304, 4, 0.307, 7.849, 23.164),
    ("lstm", 3840, 4, 0.1, 7.866, 21.582),
    ("lstm", 2304, 4, 0.45, 11.444, 28.060),
    ("lstm", 5280, 4, 0.1, 16.078, 43.073),
    ("gru", 2304, 4, 0.3, 6.254, 14.894),
    ("gru", 2304, 16, 0.3, 15.910, 40.250),
    ("gru", 2304, 16, 0.6, 27.891, 61.554),
]


@pytest.mark.slow
@pytest.mark.parametrize("point", MEASURED, ids=lambda pt: ":".join(map(str, pt[:4])))
def test_the_cost_model_is_within_12_percent_of_the_h100(point):
    # a random mask like the run's (torch's CUDA generator made that one): its fullest strips
    # and slot counts decide the layout (shared memory, halves or registers) the cost prices
    name, D, B, density, fw_ms, fwbw_ms = point
    ir = rnncc.load_builtin(name).ir
    gates = Problem.from_cell(ir, heads=1, head_dim=D, batch=B).gates_r
    g = torch.Generator().manual_seed(0)
    mask = torch.empty(gates, 1, D, D, dtype=torch.bool).bernoulli_(density, generator=g)
    strip, piece, counts = StripDensities()(mask, gs.block_units(D, H100.sm_count))
    p = Problem.from_cell(
        ir, heads=1, head_dim=D, batch=B, density=strip, piece_density=piece, slot_counts=counts
    )
    cost = SPARSE.cost(p, H100, {})
    fw_us, bw_us = fw_ms / T_STEPS * 1e3, (fwbw_ms - fw_ms) / T_STEPS * 1e3
    assert abs(cost.forward_us / fw_us - 1) <= 0.12
    assert abs(cost.backward_us / bw_us - 1) <= 0.12


def test_blocks_fill_the_sms_with_an_even_number_of_units():
    for D, sms in itertools.product((24, 512, 2304, 4096), (114, 132)):
        u = gs.block_units(D, sms)
        assert u % 2 == 0 and -(-D // u) <= sms and (u == 2 or -(-D // (u - 2)) > sms)


def test_the_plan_sizes_entries_shared_memory_and_the_exchange():
    p = lstm(2304)
    build = SPARSE.build(p, H100)
    assert (build["units"], build["rows"]) == (18, 4)
    assert SPARSE.build(dataclasses.replace(p, batch=5), H100)["rows"] == 8
    for side in ("fw", "bw"):
        assert build[f"{side}_entries"] % 4 == 0
        assert build[f"{side}_entries"] >= gs.strip_entries(p, 18)
        assert build[f"{side}_smem"] <= H100.smem_per_block_optin
    launch = SPARSE.launch(p, H100, {})
    assert launch.forward.grid == (128, 1, 1) and launch.forward.launches == 1
    assert launch.exchange_words == 4 * 2304
    # values and a counter, to a multiple of 4 words, then each block's scratch: the fuller
    # side's tables (the backward's: its 4 gates' chunks of 18 slots, 16 bank groups and a
    # count each, and a piece and a slot for each of 512 lanes), then its strip's entries
    tables = 4 * 18 * (16 + 1) + 2 * 4 * 512
    scratch = -(-(tables + gs.strip_entries(p, 18) + 1) // 4) * 4
    assert build["scratch"] == scratch
    assert launch.exchange_buffer_words == (2 * 4 * 2304 * 4 // 2 + 1 + 3) // 4 * 4 + 128 * scratch
    # Two chunks of 8 rows do not fit 132 SMs at once: one launch each.
    two = SPARSE.launch(dataclasses.replace(p, batch=16), H100, {})
    assert two.forward.grid == (128, 1, 1) and two.forward.launches == 2


def test_strip_density_is_the_fullest_block_rows_or_columns():
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(3, 2, 10, 10, generator=g) < 0.4
    units = 4
    want = 0.0
    for n, u0 in itertools.product(range(2), range(0, 10, units)):
        rows = mask[:, n, u0 : u0 + units, :].sum().item()
        cols = mask[:, n, :, u0 : u0 + units].sum().item()
        want = max(want, rows, cols)
    assert strip_density(mask, units) == want / (3 * units * 10)


def test_piece_density_is_the_fullest_half_strip_or_gate_half():
    g = torch.Generator().manual_seed(1)
    mask = torch.rand(3, 2, 10, 10, generator=g) < 0.4
    units, h = 4, 5
    want = 0.0
    for n, u0, half in itertools.product(range(2), range(0, 10, units), range(2)):
        cols = slice(half * h, half * h + h)
        fw = mask[:, n, u0 : u0 + units, cols].sum().item() / (3 * units * h)  # rows, a column half
        for k in range(3):  # columns, a gate's row half
            bw = mask[k, n, cols, u0 : u0 + units].sum().item() / (units * h)
            want = max(want, fw, bw)
    assert piece_density(mask, units) == pytest.approx(want)
    assert piece_density(mask, units) >= strip_density(mask, units)
    # an odd D has no halves: a gate's rows whole
    odd = mask[:, :, :9, :9]
    want_odd = max(
        odd[k, n, :, u0 : u0 + units].sum().item() / (units * 9)
        for k in range(3)
        for n in range(2)
        for u0 in range(0, 9, units)
    )
    assert piece_density(odd, units) == pytest.approx(max(want_odd, strip_density(odd, units)))


def test_strip_densities_are_kept_until_the_mask_changes():
    kept = StripDensities()
    mask = torch.zeros(1, 1, 8, 8, dtype=torch.bool)
    assert kept(mask, 2)[:2] == (0.0, 0.0)
    empty = kept(mask, 2)[2]
    mask[0, 0, 0] = True  # in place: its version moves; its row is one half strip's half
    assert kept(mask, 2)[:2] == (8 / 16, 4 / 8)
    assert kept(mask.clone(), 2)[:2] == (8 / 16, 4 / 8)
    assert kept(mask, 2)[2].key == kept(mask.clone(), 2)[2].key != empty.key
    mask[0, 0, :, 0] = True  # and column 0: strips of 9 of 16; rows 0-3 of columns 0-1 hold 5 of 8
    assert kept(mask, 2)[:2] == (9 / 16, 5 / 8)


def test_magnitude_mask_keeps_the_largest_of_each_gate_and_head():
    R = torch.randn(4, 3, 8, 8, dtype=torch.float64)
    mask = magnitude_mask(R, 0.25)
    assert (mask.sum((2, 3)) == 16).all()
    for k, n in itertools.product(range(4), range(3)):
        kept, dropped = R[k, n].abs()[mask[k, n]], R[k, n].abs()[~mask[k, n]]
        assert kept.min() >= dropped.max()
    with pytest.raises(ValueError, match=r"density must be in \(0, 1\], got 0"):
        magnitude_mask(R, 0)


def test_a_mask_is_checked_against_r():
    R = torch.zeros(4, 1, 8, 8)
    bad = [
        (None, R.bool().float(), "mask= needs R"),
        (R, R.float(), "mask has dtype torch.float32, expected torch.bool"),
        (R, R[:, :, :4].bool(), r"mask has shape \[4, 1, 4, 8\], expected \[4, 1, 8, 8\]"),
        (R, R.bool().to_sparse(), "dense \\(strided\\) bool tensor"),
        (R, [[True]], "mask must be a bool torch.Tensor of shape \\[4, 1, 8, 8\\]"),
    ]
    for r, mask, message in bad:
        with pytest.raises(ValueError, match=message):
            validate_mask(mask, r)


def test_a_masked_call_runs_r_times_the_mask_and_its_gradient_there_only():
    B, T, D = 2, 5, 8
    x = {
        "Wx": torch.randn(B, T, 4, 1, D, dtype=torch.float64),
        "b": torch.randn(4, 1, D, dtype=torch.float64),
    }
    R = torch.randn(4, 1, D, D, dtype=torch.float64, requires_grad=True)
    mask = magnitude_mask(R, 0.3)
    y, last = LSTM(x["Wx"], R, x["b"], mask=mask)
    y_dense, last_dense = LSTM(x["Wx"], (R * mask).detach(), x["b"])
    assert torch.equal(y, y_dense) and torch.equal(last, last_dense)
    (y.sum() + last.sum()).backward()
    assert (R.grad[~mask] == 0).all() and (R.grad[mask] != 0).any()


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr], ids=str)
def test_a_sparse_r_runs_masked_by_its_stored_entries_with_a_gradient_in_its_layout(layout):
    B, T, NH, D = 2, 5, 2, 8
    Wx = torch.randn(B, T, 4, NH, D, dtype=torch.float64)
    b = torch.randn(4, NH, D, dtype=torch.float64)
    R = torch.randn(4, NH, D, D, dtype=torch.float64)
    mask = magnitude_mask(R, 0.3)  # as many kept in each gate's and head's matrix (CSR needs it)
    R[tuple(mask.nonzero()[0].tolist())] = 0.0  # a stored zero is kept
    pattern = mask.double()
    pattern = pattern.to_sparse_csr() if layout == torch.sparse_csr else pattern.to_sparse()
    sparse = R.sparse_mask(pattern)  # R's values at the mask's entries
    assert sparse.layout == layout
    assert sparse.values().count_nonzero() < sparse.values().numel()
    sparse.requires_grad_()
    assert torch.equal(sparse_r(sparse, None)[1], mask)
    dense = R.clone().requires_grad_()
    y, last = LSTM(Wx, sparse, b)
    y_masked, last_masked = LSTM(Wx, dense, b, mask=mask)
    assert torch.equal(y, y_masked) and torch.equal(last, last_masked)
    (y.sum() + last.sum()).backward()
    (y_masked.sum() + last_masked.sum()).backward()
    assert sparse.grad is not None and sparse.grad.layout == layout
    assert torch.equal(sparse.grad.to_dense(), dense.grad)  # the stored entries only
    step, step_masked = LSTM.step(Wx[:, 0], sparse.detach(), b), LSTM.step(Wx[:, 0], R * mask, b)
    assert all(torch.equal(u, v) for u, v in zip(step, step_masked, strict=True))


def _blocks_mask(shape: tuple[int, ...], block: int, kept: int) -> torch.Tensor:
    """A mask of ``kept`` random ``block`` x ``block`` blocks in each gate's and head's matrix
    (the same count in each, as torch's batched block-sparse tensors need)."""
    G, NH, D, _ = shape
    n = D // block
    blocks = torch.zeros(G * NH, n * n, dtype=torch.bool)
    for m in blocks:
        m[torch.randperm(n * n)[:kept]] = True
    return blocks.view(G, NH, n, n).repeat_interleave(block, 2).repeat_interleave(block, 3)


@pytest.mark.parametrize("layout", ["bsr", "bsc", "csc"])
def test_a_block_sparse_or_csc_r_runs_masked_by_its_stored_entries(layout):
    B, T, NH, D = 2, 4, 2, 8
    Wx = torch.randn(B, T, 4, NH, D, dtype=torch.float64)
    b = torch.randn(4, NH, D, dtype=torch.float64)
    R = torch.randn(4, NH, D, D, dtype=torch.float64)
    mask = _blocks_mask(R.shape, 2, 5)
    if layout != "csc":  # a zero inside a stored block is kept with its block
        R[tuple(mask.nonzero()[0].tolist())] = 0.0
    sparse = {
        "bsr": lambda t: t.to_sparse_bsr((2, 2)),
        "bsc": lambda t: t.to_sparse_bsc((2, 2)),
        "csc": lambda t: t.to_sparse_csc(),
    }[layout](R * mask)
    assert torch.equal(sparse_r(sparse, None)[1], mask)
    y, last = LSTM(Wx, sparse, b)
    y_masked, last_masked = LSTM(Wx, R, b, mask=mask)
    assert torch.equal(y, y_masked) and torch.equal(last, last_masked)
    step, step_masked = LSTM.step(Wx[:, 0], sparse, b), LSTM.step(Wx[:, 0], R * mask, b)
    assert all(torch.equal(u, v) for u, v in zip(step, step_masked, strict=True))
    with pytest.raises(
        ValueError,
        match=rf"^R is a torch.sparse_{layout} tensor that requires grad, and torch cannot give "
        r"a gradient in that layout: give R as a sparse COO or CSR tensor",
    ):
        LSTM(Wx, sparse.detach().requires_grad_(), b)


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_a_sparse_r_with_a_mask_or_of_the_wrong_shape_is_refused():
    Wx = torch.randn(2, 3, 4, 1, 8, dtype=torch.float64)
    R = torch.randn(4, 1, 8, 8, dtype=torch.float64)
    b = torch.zeros(4, 1, 8, dtype=torch.float64)
    for sparse in (R.to_sparse(), R.to_sparse_csr()):
        with pytest.raises(
            ValueError, match="stored entries are the mask: give mask= only with a dense R"
        ):
            LSTM(Wx, sparse, b, mask=R > 0)
    with pytest.raises(ValueError, match=r"^R has shape \[4, 1, 4, 8\], expected \[4, 1, 8, 8\]"):
        LSTM(Wx, torch.ones(4, 1, 4, 8, dtype=torch.float64).to_sparse(), None)
    with pytest.raises(ValueError, match=r"^R has shape \[8, 8\], expected \[4, 1, 8, 8\]"):
        LSTM(Wx, R[0, 0].to_sparse_csr(), b)


def test_slot_counts_are_each_blocks_entries_per_chunk_and_slot():
    g = torch.Generator().manual_seed(2)
    G, NH, D, units = 3, 2, 10, 4
    mask = torch.rand(G, NH, D, D, generator=g) < 0.4
    counts = slot_counts(mask, units)
    assert counts.units == units
    blocks = -(-D // units)
    h = D // 2
    for n, u in itertools.product(range(NH), range(blocks)):
        b = n * blocks + u
        for k, du in itertools.product(range(G), range(units)):
            d = u * units + du
            for half in range(2):
                cols = slice(half * h, half * h + h)
                # forward: R's row d of gate k, by halves of its columns (slot k * units + unit)
                want = mask[k, n, d, cols].sum().item() if d < D else 0
                assert counts.forward[b, half, k * units + du] == want
                # backward: R's column d, by gate and half of its rows
                want = mask[k, n, cols, d].sum().item() if d < D else 0
                assert counts.backward[b, k, half, du] == want
    # the chunks of each staging the kernels plan: halves, whole, a gate at a time, all gates
    fw, bw = counts.forward, counts.backward
    assert (counts.chunks(False, 1, 2) == fw).all()
    assert (counts.chunks(False, 1, 1)[:, 0] == fw.sum(1)).all()
    assert (counts.chunks(True, 1, 2)[:, 2 * 1 + 1] == bw[:, 1, 1]).all()  # gate 1, second half
    assert (counts.chunks(True, 1, 1) == bw.sum(2)).all()
    assert (counts.chunks(True, G, 1)[:, 0] == bw.sum((1, 2))).all()
    with pytest.raises(ValueError, match="no chunks of 3 gates in 2 parts"):
        counts.chunks(True, G, 2)
    # a mask's counts decide its plan's shared memory, not its densities
    p = dataclasses.replace(lstm(2304), slot_counts=counts)
    assert p == lstm(2304) and "slot_counts" not in p.as_dict()


def test_a_masks_plan_counts_its_layout_exactly():
    g = torch.Generator().manual_seed(3)
    for D, density in ((64, 0.3), (2304, 0.3)):
        mask = torch.rand(4, 1, D, D, generator=g) < density
        units = gs.block_units(D, H100.sm_count)
        counts = slot_counts(mask, units)
        p = lstm(D, density=strip_density(mask, units), slot_counts=counts)
        for backward, gates, split in ((False, 1, 1), (False, 1, 2), (True, 1, 1), (True, 4, 1)):
            chunks = gs._chunks(p, backward, gates, split)
            r = gs.rounds(p, units, backward, gs.THREADS, chunks)
            exact = pieces.shared_entries(counts.chunks(backward, gates, split), 16, r, 0)
            assert gs.shared_entries(p, units, backward, gates, split, gs.THREADS, 0) == exact
            if D == 2304:  # without the counts the densities estimate it, with room to spare here
                plain = dataclasses.replace(p, slot_counts=None)
                estimate = gs.shared_entries(plain, units, backward, gates, split, gs.THREADS, 0)
                assert exact <= estimate <= 1.04 * exact
