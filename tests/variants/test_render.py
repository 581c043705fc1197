"""The fused variants' CUDA: golden files, the constraints that rule each variant out, the
build record reaching the kernels' traits, nvcc compiling every example's libraries with no
register spills (for sm_90a with no warnings either, sm_80 and sm_89), and in the SASS of the
grid forward every load of h before the product's first mma."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from codegen.test_stepwise_codegen import _compile, _nvcc

import rnncc
from rnncc.codegen.source import GeneratedSource
from rnncc.frontend import compile_source
from rnncc.ir.cell import Cell
from rnncc.resources import templates_dir
from rnncc.tiling import Problem, caps_for_arch
from rnncc.tiling.solve import diagnose, points, solve
from rnncc.variants import BY_NAME, VARIANTS, Variant, block_ffma, block_mma, costs, grid_mma
from rnncc.variants.base import cdiv

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.rnn"))
GOLDEN = ROOT / "tests" / "golden"
H100 = caps_for_arch("h100")
FUSED = tuple(v for v in VARIANTS if v.host == "fused")
FFMA, MMA, GRID = BY_NAME["block_ffma"], BY_NAME["block_mma"], BY_NAME["grid_mma"]
STREAM, SPARSE = BY_NAME["grid_stream"], BY_NAME["grid_sparse"]


def problem(
    cell: Cell,
    D: int,
    variant: Variant,
    batch: int = 16,
    timeline: bool = False,
    dtype: str | None = None,
) -> Problem:
    """One head of ``cell`` at head dim ``D`` in ``dtype`` (default: the first storage dtype
    ``variant`` runs; ``timeline``: with per-row lengths or reversed)."""
    return Problem.from_cell(
        cell, heads=1, head_dim=D, batch=batch, dtype=dtype or variant.dtypes[0], timeline=timeline
    )


def ruled_out(cell: Cell, D: int, variant: Variant, caps=H100) -> list[str]:
    """The constraints that rule ``variant`` out for ``cell`` at ``D`` on the device of ``caps``
    (an H100 unless given); [] where some point of it is feasible."""
    p = problem(cell, D, variant)
    return [] if points(variant, p, caps) else diagnose(variant, p, caps)


def render(
    cell: rnncc.CompiledCell,
    variant: Variant,
    D: int,
    timeline: bool = False,
    caps=None,
    dtype: str | None = None,
) -> GeneratedSource:
    """The library of ``variant`` for ``cell`` at head dim ``D`` in ``dtype`` (default: the
    variant's first), built for the arch of ``caps`` (None: Hopper's)."""
    build = variant.build(problem(cell.ir, D, variant, timeline=timeline, dtype=dtype), caps)
    return variant.render(cell.ir, cell.backward_ir, build)


def compile_cell(text: str) -> Cell:
    (cell,), _ = compile_source(text)
    return cell


def example(name: str) -> rnncc.CompiledCell:
    return rnncc.load(ROOT / "examples" / f"{name}.rnn")


GOLDEN_CASES = [(p, v, 64, None) for p in EXAMPLES for v in (FFMA, MMA)]
GOLDEN_CASES += [(p, GRID, 256, None) for p in EXAMPLES if p.stem in ("lstm", "gru")]
GOLDEN_CASES += [(p, GRID, 256, "fp32") for p in EXAMPLES if p.stem == "lstm"]


@pytest.mark.parametrize(
    ("path", "variant", "D", "dtype"),
    GOLDEN_CASES,
    ids=[f"{p.stem}-{v.name}-d{D}{'-' + t if t else ''}" for p, v, D, t in GOLDEN_CASES],
)
def test_golden(path, variant, D, dtype, update_golden):
    cell = rnncc.load(path)
    if ruled_out(cell.ir, D, variant):
        pytest.skip(f"{variant.name} does not run {cell.name} at head dim {D}")
    src = render(cell, variant, D, dtype=dtype)
    golden = GOLDEN / src.filename
    if update_golden:
        golden.write_text(src.text)
    assert golden.exists(), f"no golden file {golden}; run pytest --update-golden"
    assert src.text == golden.read_text(), f"{src.filename} changed; review, then --update-golden"


def test_head_dim_limits_of_each_variant():
    lstm = example("lstm").ir
    on_chip = [v for v in FUSED if v not in (STREAM, SPARSE)]
    assert all(not ruled_out(lstm, block_ffma.MAX_HEAD_DIM, v) for v in on_chip)
    # Streaming blocks only where their R does not fit on chip; where grid_mma's does too,
    # the planner prefers it (nothing to stream).
    assert ruled_out(lstm, 64, STREAM) == ["streams_what_the_chip_cannot_hold"]
    assert solve(problem(lstm, 2112, STREAM), H100).variant == "grid_mma"
    assert solve(problem(lstm, 2304, STREAM), H100).variant == "grid_stream"
    assert not ruled_out(lstm, 4224, STREAM)
    assert ruled_out(lstm, 4225, STREAM) == ["head_blocks_co_resident"]
    assert ruled_out(lstm, 65, FFMA) == ["r_row_fits_registers"]
    assert ruled_out(lstm, 65, MMA) == ["r_fragments_fit_registers"]
    # Past the block tier the grid tier: 16-bit, and float32 as 3xTF32 on narrow blocks.
    assert not ruled_out(lstm, 65, GRID)
    assert solve(problem(lstm, 65, FFMA), H100).variant == "grid_mma"
    assert solve(problem(lstm, 1024, FFMA), H100).variant == "grid_mma"
    assert solve(problem(lstm, 1025, FFMA), H100).variant == "stepwise"
    # 129 warps of 8 units: past the block tier's 16.
    assert "block_warps" in ruled_out(lstm, 1025, MMA)
    # A head's blocks, 16 units each past 1024 (R split between registers and shared
    # memory), must all be resident on the 132 SMs: 2112 units at most.
    assert not ruled_out(lstm, 2112, GRID)
    assert "head_blocks_co_resident" in ruled_out(lstm, 2113, GRID)
    with pytest.raises(ValueError, match="got 'float64'"):
        Problem.from_cell(lstm, heads=1, head_dim=64, batch=16, dtype="float64")


def test_sizes_the_variants_derive():
    lstm, elman = example("lstm").ir, example("elman").ir
    p768 = problem(lstm, 768, GRID)
    assert grid_mma.forward_warps(p768, 1)[0] == 6 and grid_mma.backward_warps(p768, 1)[0] == 8
    assert grid_mma.exchange_words(p768) == 4 * 768
    # One gate, 13 k tiles: h in fragment order takes 7 whole pairs of tiles, longer than dg.
    assert grid_mma.exchange_words(problem(elman, 200, GRID)) == 224
    assert block_mma.fragment_registers(problem(lstm, 64, MMA)) == 32
    assert block_mma.fragment_registers(problem(elman, 128, MMA)) == 32
    assert block_ffma.threads(problem(lstm, 64, FFMA)) == 256
    assert block_ffma.threads(problem(lstm, 8, FFMA)) == 128
    assert [block_mma.warps(problem(lstm, D, MMA)) for D in (64, 8, 20)] == [8, 1, 3]
    # One gate of R: 128 units fit the block tier as mma fragments, not as float rows.
    assert not ruled_out(elman, 128, MMA)
    assert ruled_out(elman, 128, FFMA) == ["r_row_fits_registers"]


def _gates(n: int, kind: str = "R h") -> str:
    return ", ".join(f"g{k}" for k in range(n)) + f" = {kind}"


def test_wide_gates_cells():
    wide = compile_cell(
        f"cell w(h) {{\n  gates {_gates(20)}\n  h = {' + '.join(f'g{k}' for k in range(20))}\n}}\n"
    )
    # 1280 rows of R exceed the 1024 threads of a block.
    assert ruled_out(wide, 64, FFMA) == ["r_rows_fit_block", "backward_fits_shared_memory"]
    assert block_mma.fragment_registers(problem(wide, 64, MMA)) == 160
    assert ruled_out(wide, 64, MMA) == ["r_fragments_fit_registers"]
    assert not ruled_out(wide, 64, GRID)

    wider = compile_cell(
        f"cell w(h) {{\n  gates {_gates(34)}\n  h = {' + '.join(f'g{k}' for k in range(34))}\n}}\n"
    )
    # R as fragments takes 68 registers per thread; one k tile of it in the grid tier as many.
    assert block_mma.fragment_registers(problem(wider, 16, MMA)) == 68
    assert ruled_out(wider, 16, MMA) == ["r_fragments_fit_registers"]
    assert ruled_out(wider, 16, GRID) == ["r_tile_fits_registers"]


def test_shared_memory_limits_of_the_block_mma_kernels():
    # Twelve gates of W x: four steps of them (the forward's ring) overflow 48 KiB.
    many = compile_cell(
        f"cell m(h) {{\n  gates {_gates(12, 'W x')}\n  gates r = R h\n"
        f"  h = tanh(r + {' + '.join(f'g{k}' for k in range(12))})\n}}\n"
    )
    assert block_mma.forward_smem(problem(many, 64, MMA)) == 2304 + 4 * 8 * (12 * 128 + 16)
    assert ruled_out(many, 64, MMA) == ["forward_fits_shared_memory"]
    assert not ruled_out(many, 56, MMA)

    # 33 states: three steps of the backward's inputs (the saved states as float) overflow
    # 227 KiB from head dim 48 on, though the forward's shared memory is small.
    states = [f"s{k}" for k in range(32)]
    deep = compile_cell(
        f"cell m(h, {', '.join(states)}) {{\n  gates r = R h\n"
        + "".join(f"  {s} = {s} * r\n" for s in states)
        + f"  h = tanh(r + {' + '.join(states)})\n}}\n"
    )
    p32 = problem(deep, 32, MMA)
    assert block_mma.backward_static_smem(p32) == 1536 + 2 * 16
    assert block_mma.input_ring(p32)["bytes"] == 3 * (8 * (34 * 160 + 144) + 16)
    assert not ruled_out(deep, 32, MMA)
    assert ruled_out(deep, 48, MMA) == ["backward_fits_shared_memory"]

    # Twelve W x gates and 96 params: the backward's static shared memory (dg and dWx
    # double-buffered, 56 units padded to 64 per param) overflows 48 KiB, the forward's not.
    params = [f"p{k}" for k in range(96)]
    gates = [f"g{k}" for k in range(12)]
    wide_params = compile_cell(
        f"cell m(h) {{\n  param {', '.join(params)}\n  gates {', '.join(gates)} = W x\n"
        f"  gates r = R h\n  h = tanh(r + {' + '.join(gates + params)})\n}}\n"
    )
    p56 = problem(wide_params, 56, MMA)
    assert block_mma.forward_smem(p56) <= 48 * 1024
    assert block_mma.backward_static_smem(p56) == 2 * 8 * 72 * 2 + 2 * 8 * 1424 + 97 * 64 * 4
    assert not ruled_out(wide_params, 48, MMA)
    assert ruled_out(wide_params, 56, MMA) == ["backward_fits_static_shared_memory"]


def test_each_variant_renders_only_its_kernels():
    """A library is its variant's skeleton on the cell: it includes that skeleton alone, its
    entry points call that skeleton's, and its build copies that skeleton's headers."""
    elman = example("elman")
    for variant in (FFMA, MMA, GRID, BY_NAME["stepwise"]):
        src = render(elman, variant, 64)
        (include,) = re.findall(r'^#include "([^"]+)"$', src.text, re.M)
        assert include == f"{variant.name}.cuh" and include in src.headers
        calls = set(re.findall(r"return (rnncc::\w+)::\w+<Cell>", src.text))
        assert calls == {f"rnncc::{variant.name}"}
        others = {f"{v.name}.cuh" for v in VARIANTS} - {include}
        assert not others & set(src.headers)
        assert all((templates_dir() / h).is_file() for h in src.headers)


def test_wide_grid_blocks_only_for_the_cells_and_sizes_that_fit_them():
    """The wide blocks' kernels (unit_tiles 2) are in the library's kernel table, and so built,
    only for cells of few states plus params and heads up to 768 units."""

    def wide(name: str, D: int) -> bool:
        cell = example(name)
        text = render(cell, GRID, D).text
        (widths,) = re.findall(r"constexpr int kGridUW\[kGridKernels\] = \{([\d, ]+)\};", text)
        built = "2" in widths.split(", ")
        feasible = {pt["unit_tiles"] for pt in points(GRID, problem(cell.ir, D, GRID), H100)}
        assert built == (2 in feasible)
        return built

    assert wide("lstm", 768)
    assert not wide("lstm", 1024)  # past WIDE_MAX_HEAD_DIM
    assert not wide("slstm", 768)  # 4 states
    assert not wide("peephole_lstm", 768)  # 2 states and 3 params


def test_timeline_kernels_are_a_build_of_their_own():
    """Calls with per-row lengths or reversed run kernels built with kTimeline (a record key,
    so a library of its own); full-length forward calls keep the kernels without it."""
    lstm = example("lstm")
    for variant in FUSED:
        if variant is SPARSE:  # full-length sequences only (test_sparse_variant.py)
            continue
        plain, timed = render(lstm, variant, 64), render(lstm, variant, 64, timeline=True)
        assert "  static constexpr bool kTimeline = false;" in plain.text.splitlines()
        assert "  static constexpr bool kTimeline = true;" in timed.text.splitlines()
        assert timed.filename == plain.filename.replace(".cu", "_timeline.cu")
        build = variant.build(problem(lstm.ir, 64, variant, timeline=True))
        assert build == {**variant.build(problem(lstm.ir, 64, variant)), "timeline": True}
        assert variant.runs_timeline(build) and not variant.runs_timeline({})
        assert variant.library_name("lstm", build).endswith("_d64_timeline")
    assert BY_NAME["stepwise"].runs_timeline(BY_NAME["stepwise"].build(problem(lstm.ir, 64, FFMA)))


def test_wide_blocks_before_hopper_only_up_to_the_head_dim_that_builds_without_spills():
    """On sm_80 and sm_89 the library builds wide blocks up to 448 units (the largest that
    ptxas gave no spills there: test_nvcc_compiles_every_example_without_spills) and the
    planner never picks one past it; on Hopper up to 768."""
    lstm = example("lstm")
    for device in ("a100", "l40s"):
        caps = caps_for_arch(device)
        for D, wide in ((448, True), (512, False), (768, False)):
            p = problem(lstm.ir, D, GRID)
            widths = {k["unit_tiles"] for k in GRID.build(p, caps)["kernels"]}
            assert (2 in widths) == wide, (device, D)
            assert (2 in {pt["unit_tiles"] for pt in points(GRID, p, caps)}) == wide
            assert grid_mma.wide_blocks_fit_registers(p, caps, 2) == wide
            plan = solve(p, caps)
            assert plan.variant == "grid_mma" and (dict(plan.point)["unit_tiles"] == 2) <= wide
    p768 = problem(lstm.ir, 768, GRID)
    assert {k["unit_tiles"] for k in GRID.build(p768, H100)["kernels"]} == {1, 2}
    assert GRID.build(p768) == GRID.build(p768, H100)


def test_batch_and_sequence_are_not_compiled_in():
    gru = example("gru")
    for variant in FUSED:
        text = render(gru, variant, 24).text
        assert "constexpr int kD = 24;" in text
        assert not re.search(r"constexpr int k(B|T)\b", text)


def _plan_record(text: str, variant: Variant) -> object:
    (line,) = [ln for ln in text.splitlines() if ln.startswith("// Plan: ")]
    prefix = f"// Plan: {variant.name}, "
    assert line.startswith(prefix), line
    return json.loads(line.removeprefix(prefix))


def _braced(values: list[int]) -> str:
    return "{" + ", ".join(map(str, values)) + "}"


@pytest.mark.parametrize(
    ("variant", "name", "D"), [(FFMA, "lstm", 64), (MMA, "lstm", 64), (GRID, "lstm", 768)]
)
def test_build_record_reaches_the_traits_and_the_header(variant, name, D):
    cell = example(name)
    build = variant.build(problem(cell.ir, D, variant))
    text = render(cell, variant, D).text
    assert _plan_record(text, variant) == build
    if variant is FFMA:
        assert (build["threads"], build["groups"]) == (256, 4)
        expected = [
            f"constexpr int kThreads = {build['threads']};",
            f"constexpr int kGroups = {build['groups']};",
        ]
    elif variant is MMA:
        ring = build["ring"]
        assert (build["warps"], build["threads"], ring["bytes"]) == (8, 256, 3 * ring["slot"])
        expected = [
            "constexpr int kWarps = 8;",
            "constexpr int kMmaThreads = 256;",
            f"constexpr int kWxAhead = {build['wx_ahead']};",
            f"constexpr int kInAhead = {build['in_ahead']};",
            f"constexpr int kWxRow = {build['wx_row']};",
            f"constexpr int kInS = {ring['row32']};",
            f"constexpr int kInR = {ring['row32']};",
            f"constexpr int kInX = {ring['row16']};",
            f"constexpr int kInY = {ring['row16']};",
            f"constexpr int kInOffR = {ring['off_r']};",
            f"constexpr int kInOffX = {ring['off_x']};",
            f"constexpr int kInOffY = {ring['off_y']};",
            f"constexpr int kInSlot = {ring['slot']};",
            f"constexpr size_t kBwSmem = {ring['bytes']};",
        ]
    else:
        kernels = build["kernels"]
        assert [(k["n_tiles"], k["unit_tiles"]) for k in kernels] == list(grid_mma.KERNELS)

        def column(key: str) -> str:
            return _braced([k[key] for k in kernels])

        expected = [
            "constexpr int kXWords = 3072;",
            "constexpr int kGridKernels = 7;",
            "constexpr int kGridNT[kGridKernels] = {1, 1, 2, 4, 2, 4, 8};",
            "constexpr int kGridUW[kGridKernels] = {1, 2, 2, 2, 1, 1, 1};",
            f"constexpr int kGridFwThreads[kGridKernels] = {column('fw_threads')};",
            f"constexpr int kGridBwThreads[kGridKernels] = {column('bw_threads')};",
            f"constexpr size_t kGridFwSmem[kGridKernels] = {column('fw_smem')};",
            f"constexpr size_t kGridBwSmem[kGridKernels] = {column('bw_smem')};",
            "constexpr int kFwWarps[3] = {6, 12, 0};",
            "constexpr int kFwKT[3] = {8, 4, 0};",
            "constexpr int kBwWarps[3] = {8, 12, 0};",
            "constexpr int kBwKT[3] = {24, 16, 0};",
            "constexpr int kFwRegKT[3] = {8, 4, 0};",  # all in registers at 768 units
            "constexpr int kFwSmemKT[3] = {0, 0, 0};",
        ]
    lines = text.splitlines()
    for line in expected:
        assert f"  static {line}" in lines, f"{line!r} not in the traits of {variant.name}"


#: Formulas that the templates once spelled and the variants' build records now own: none
#: may come back (one home per fact).
RECOMPUTED = (
    "(kD + 7) / 8;  // 8 units per warp",
    "kWarps * 32",
    "kThreads / kD",
    "144 - ",
    "in_row(",
    "(kGTiles + 1) / 2 * 32",
    "(kGTiles + 7) / 8",
    "(kGTiles + 23) / 24",
    "grid_fw_kt",
    "grid_fw_warps",
    "grid_bw_warps",
    "grid_fw_threads",
    "grid_fw_smem",
    "grid_bw_smem",
    "cudaOccupancyMaxActiveBlocksPerMultiprocessor",
)


@pytest.mark.parametrize(
    "template",
    sorted([*templates_dir().glob("*.j2"), *templates_dir().glob("*.cuh")]),
    ids=lambda p: p.name,
)
def test_templates_do_not_recompute_the_build_record(template):
    text = template.read_text(encoding="utf-8")
    assert [f for f in RECOMPUTED if f in text] == []


def _nvcc_sources(caps=H100, wide: bool = True) -> list[GeneratedSource]:
    """The libraries the planner can choose on the device of ``caps`` for every example: the
    block variants at two head dims; the grid tier (28 kernels a library: the costly builds)
    at 256 units for every example, at 768 for the largest cells (and 1024 for the sLSTM, 512
    for the LSTM), at a small head once, and past 1024 units split wide blocks and streaming blocks.
    ``wide=False`` (the other architectures): the block variants at one head dim and the grid
    tier at 256 units (for LSTM, GRU, sLSTM and the peephole LSTM), and the LSTM's at 448 (the
    largest head of wide blocks there) and, on sm_80, 768 (narrow blocks only: wide ones
    spilled there). Fewer than on Hopper: the suite's time. fp32's grid tier where it has the
    least room."""
    cells = {c.name: c for c in map(rnncc.load, EXAMPLES)}
    dims = (24, 64) if wide else (64,)
    cases = [(c, v, D) for c in cells.values() for D in dims for v in (FFMA, MMA)]
    # The grid tier at 256 units for every cell on Hopper; elsewhere for the three main cells
    # and the peephole LSTM (the most states and outputs) only, for the suite's time: every
    # cell's hooks in that skeleton compile for sm_90a.
    grid_cells = tuple(cells) if wide else ("lstm", "gru", "slstm", "peephole_lstm")
    cases += [(cells[n], GRID, 256) for n in grid_cells]
    if wide:
        cases += [(c, MMA, 128) for c in cells.values()]
        cases += [(cells["lstm"], GRID, 24)]
        cases += [(cells[n], GRID, 768) for n in ("lstm", "slstm", "peephole_lstm", "gru")]
        # The LSTM at 512 units: its wide backward has 8 warps, up to 255 registers a thread,
        # where ptxas schedules the prologue's loads of R most freely.
        cases += [(cells["lstm"], GRID, 512)]
        # At 1024 units the narrow backward of 4-gate cells keeps part of R in shared memory
        # (with all of it in registers they spilled): the sLSTM's, which spilled the most.
        cases += [(cells["slstm"], GRID, 1024)]
        # Past 1024 units: wide blocks that split R between registers and shared memory (the
        # LSTM at 2048), and streaming blocks (the LSTM at 4096, the GRU at 2304, 18 k tiles
        # a warp, where a larger forward register budget spilled).
        cases += [(cells["lstm"], GRID, 2048)]
        cases += [(cells["lstm"], STREAM, 4096), (cells["gru"], STREAM, 2304)]
    else:
        cases += [(cells["lstm"], GRID, 448)]
        if caps.arch == "sm_80":
            cases += [(cells["lstm"], GRID, 768)]
    sources = [render(c, v, D, caps=caps) for c, v, D in cases if not ruled_out(c.ir, D, v, caps)]
    # fp32 (3xTF32, narrow blocks), the suite's time allowing few: on Hopper the kernels with
    # the least room (the peephole LSTM's forward at 1024 units, 254 registers; the sLSTM's
    # backward at 768), on sm_80 the LSTM's at 1024.
    if wide:
        fp32 = [("slstm", 768), ("peephole_lstm", 1024)]
    else:
        fp32 = [("lstm", 1024)] if caps.arch == "sm_80" else []
    sources += [render(cells[n], GRID, D, caps=caps, dtype="fp32") for n, D in fp32]
    # The kernels of calls with per-row lengths or reversed (kTimeline), fewer (the suite's
    # time): on Hopper the block variants for every example and the LSTM's grid tier at 256
    # and 768 units (wide blocks); elsewhere the LSTM's block and grid kernels.
    if wide:
        timed = [(c, v, 64) for c in cells.values() for v in (FFMA, MMA)]
        timed += [(cells["lstm"], GRID, 256), (cells["lstm"], GRID, 768)]
    else:
        timed = [(cells["lstm"], v, 64) for v in (FFMA, MMA)] + [(cells["lstm"], GRID, 256)]
    sources += [
        render(c, v, D, timeline=True, caps=caps)
        for c, v, D in timed
        if not ruled_out(c.ir, D, v, caps)
    ]
    if wide:  # grid_sparse (planned only for masks): every cell with an R, 8 batch rows, and 4;
        sources += [render(c, SPARSE, 2304, caps=caps) for c in cells.values() if c.gr_names]
        lstm = cells["lstm"]
        p4 = dataclasses.replace(problem(lstm.ir, 2304, SPARSE), batch=4)
        sources += [SPARSE.render(lstm.ir, lstm.backward_ir, SPARSE.build(p4, caps))]
        # the backward staging all of dg (8 rows: its widest stage) at 9 %
        slstm = cells["slstm"]
        p10 = dataclasses.replace(problem(slstm.ir, 2304, SPARSE), density=0.09)
        assert SPARSE.build(p10, caps)["bw_gates"] == 4
        sources += [SPARSE.render(slstm.ir, slstm.backward_ir, SPARSE.build(p10, caps))]
        # h and dg staged in halves, with the lanes' registers holding part of the entries
        # (5280 units, 10 %: the widest register kernels)
        p5280 = dataclasses.replace(problem(lstm.ir, 5280, SPARSE), batch=4, density=0.1)
        regs = SPARSE.build(p5280, caps)
        assert (regs["fw_split"], regs["bw_split"], regs["threads"]) == (2, 2, 256)
        assert regs["fw_reg_steps"] > 0 and regs["bw_reg_steps"] > 0
        sources += [SPARSE.render(lstm.ir, lstm.backward_ir, regs)]
    return sources


#: The architectures every generated kernel must build for, with a device's caps to plan on:
#: Hopper (tested on hardware), Ampere and Ada (compile-checked).
ARCHS = [("sm_90a", "h100", True), ("sm_80", "a100", False), ("sm_89", "l40s", False)]


def _host_compiled(sources: list[GeneratedSource]) -> set[int]:
    """The sources whose host code the nvcc test compiles too: the first of each variant, with
    and without per-row lengths (its skeleton's launches; the cell changes only names there).
    The rest build their device code alone, which ptxas reports on the same."""
    first: dict[tuple[str, bool], int] = {}
    for i, src in enumerate(sources):
        variant = next(v.name for v in FUSED if f"_{v.name}_" in src.filename)
        first.setdefault((variant, "_timeline" in src.filename), i)
    return set(first.values())


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "device", "wide"), ARCHS, ids=[a for a, _, _ in ARCHS])
def test_nvcc_compiles_every_example_without_spills(arch, device, wide, tmp_path):
    nvcc = _nvcc()
    sources = _nvcc_sources(caps_for_arch(device), wide)
    assert len(sources) >= (60 if wide else 24), [s.filename for s in sources]
    dirs = [tmp_path / str(i) for i in range(len(sources))]  # names repeat across plans
    for d in dirs:
        d.mkdir()
    host = _host_compiled(sources)
    assert len(host) >= (5 if wide else 3), host

    def build(i: int) -> str:
        return _compile(nvcc, sources[i], dirs[i], arch, device_only=i not in host)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        reports = list(pool.map(build, range(len(sources))))
    for src, report in zip(sources, reports, strict=True):
        spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
        assert spills, f"no ptxas report for {src.filename}:\n{report}"
        assert all(s == ("0", "0") for s in spills), f"{src.filename} spills registers:\n{report}"
        assert "warning" not in report.lower(), f"{src.filename}:\n{report}"


@pytest.mark.slow
def test_nvcc_compiles_the_step_trace(tmp_path):
    """grid_mma's phase marks (benchmarks/step_phases.py) build: one kernel of each width, the
    per-row lengths' kernels (the bidirectional layer's), with -DRNNCC_STEP_TRACE."""
    lstm = example("lstm")
    build = dict(GRID.build(problem(lstm.ir, 256, GRID, timeline=True)))
    build["kernels"] = [k for k in build["kernels"] if k["n_tiles"] == 1]
    assert {k["unit_tiles"] for k in build["kernels"]} == {1, 2}
    src = GRID.render(lstm.ir, lstm.backward_ir, build)
    report = _compile(_nvcc(), src, tmp_path, extra=("-DRNNCC_STEP_TRACE",))
    # the marks are compiled in: the printf of its means takes each of the 8 kernels (2 widths,
    # 2 dtypes, forward and backward) a stack frame, which they have none of without it
    frames = [int(f) for f in re.findall(r"(\d+) bytes stack frame", report)]
    assert sum(f > 0 for f in frames) == 8, report


@pytest.mark.slow
def test_nvcc_compiles_grid_sparse_with_the_step_trace(tmp_path):
    """grid_sparse's phase marks build too: its 4 kernels (2 dtypes, forward and backward)
    each take the printf's stack frame with -DRNNCC_STEP_TRACE, and none without it."""
    lstm = example("lstm")
    p = dataclasses.replace(problem(lstm.ir, 2304, SPARSE), batch=4, density=0.3)
    src = SPARSE.render(lstm.ir, lstm.backward_ir, SPARSE.build(p, H100))
    for extra, framed in (((), 0), (("-DRNNCC_STEP_TRACE",), 4)):
        (tmp_path / str(framed)).mkdir()
        report = _compile(_nvcc(), src, tmp_path / str(framed), extra=extra)
        frames = [int(f) for f in re.findall(r"(\d+) bytes stack frame", report)]
        assert sum(f > 0 for f in frames) == framed, report


def _nvdisasm() -> str:
    """nvdisasm: on PATH or beside nvcc (a CUDA toolkit), else the test extra's
    ``nvidia-cuda-nvdisasm`` wheel (Linux x86-64); CI must have it, elsewhere the test that needs
    it skips."""
    found = shutil.which("nvdisasm")
    nvcc = shutil.which("nvcc")
    beside = Path(nvcc).parent / "nvdisasm" if nvcc else None
    if found is None and beside is not None and beside.is_file():
        found = str(beside)
    spec = importlib.util.find_spec("nvidia")  # a namespace package: every nvidia-* wheel's
    if found is None and spec is not None and spec.submodule_search_locations:
        wheel = [
            p for b in spec.submodule_search_locations for p in Path(b).glob("cu*/bin/nvdisasm")
        ]
        found = str(sorted(wheel)[-1]) if wheel else None
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("nvdisasm not found (pip install nvidia-cuda-nvdisasm, the test extra)")
        pytest.skip("nvdisasm is not installed here")
    return found


def _loads_after_the_first_mma(sass: str) -> tuple[int, int]:
    """(products, late loads) of a kernel's SASS: each product starts at a barrier; a late load
    is a 128-bit load from global memory (an exchange row's fragments) after the product's
    first mma and before its partial sums go to shared memory."""
    products = late = 0
    state = None
    for ins in re.findall(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", sass):
        op = re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0]
        if op.startswith("BAR.SYNC"):
            state = "loads"
        elif op.startswith("HMMA") and state == "loads":
            state, products = "mma", products + 1
        elif op.startswith("LDG.E.128") and state == "mma":
            late += 1
        elif op.startswith("STS") and state == "mma":
            state = None
    return products, late


@pytest.mark.slow
def test_grid_forward_issues_every_h_load_before_its_first_mma(tmp_path):
    """ptxas had sunk a later k tile's load of h below the mmas of an earlier one (into its
    registers): one more L2 round trip in every step
    (benchmarks/results/grid-loads-first-h100-2026-11-27.txt). The warp
    barrier in templates/grid_mma.cuh keeps the loads first: checked in the SASS of the narrow
    kernels where it happened (the sLSTM at 768 units, one and two n tiles) and of the
    bidirectional layer's wide kernel (the LSTM at 768 units, per-row lengths, two n tiles)."""
    nvcc, nvdisasm = _nvcc(), _nvdisasm()
    cases = [("slstm", False, lambda k: k["unit_tiles"] == 1 and k["n_tiles"] <= 2)]
    cases += [("lstm", True, lambda k: k["unit_tiles"] == 2 and k["n_tiles"] == 2)]
    sources = []
    for name, timeline, keep in cases:
        cell = example(name)
        build = dict(GRID.build(problem(cell.ir, 768, GRID, timeline=timeline)))
        build["kernels"] = [k for k in build["kernels"] if keep(k)]
        sources.append(GRID.render(cell.ir, cell.backward_ir, build))
    dirs = [tmp_path / str(i) for i in range(len(sources))]
    for d in dirs:
        d.mkdir()
    with ThreadPoolExecutor(max_workers=len(sources)) as pool:
        list(
            pool.map(
                lambda i: _compile(nvcc, sources[i], dirs[i], device_only=True), range(len(dirs))
            )
        )
    checked = 0
    for src, d in zip(sources, dirs, strict=True):
        cubin = (d / "sm_90a" / src.filename).with_suffix(".cubin")
        text = subprocess.run([nvdisasm, str(cubin)], capture_output=True, text=True, check=True)
        kernels = re.findall(r"^\.text\.(\S+):\n(.*?)(?=^\.text\.|\Z)", text.stdout, re.S | re.M)
        for name, sass in kernels:
            if "forward_kernel" in name:
                products, late = _loads_after_the_first_mma(sass)
                assert products > 0 and late == 0, (src.filename, name, products, late)
                checked += 1
    assert checked == 6, checked  # bf16 and fp16: the sLSTM's two kernels, the LSTM's one


@pytest.mark.parametrize(("name", "D"), [("lstm", 2048), ("lstm", 4096), ("gru", 2304)])
def test_split_and_streaming_blocks_place_every_k_tile_of_r_once(name, D):
    """A warp's k tiles of R are in registers, shared memory or global memory, each once; the
    shared-memory part fits beside the partial sums, and the plan's exchange buffer holds the
    streamed part after the counters (rnncc_abi.h), one region per (head, block)."""
    cell = example(name).ir
    for variant, uw in ((GRID, 2), (STREAM, 4)):
        p = problem(cell, D, variant)
        if ruled_out(cell, D, variant):
            continue
        for backward in (False, True):
            warps, kt = (grid_mma.backward_warps if backward else grid_mma.forward_warps)(p, uw)
            regs, smem, glob = grid_mma._tiles(p, uw, backward)
            assert regs + smem + glob == kt and min(regs, smem, glob) >= 0
            k = grid_mma.gate_tiles(p) if backward else grid_mma.k_tiles(p)
            assert warps * kt >= k > warps * (kt - 1)  # the product's k, split over the warps
            assert (glob > 0) == (uw == 4)  # only streaming blocks read R from memory
        plan = solve(p, H100)
        assert plan.variant == variant.name
        launch, b8 = plan.launch, cdiv(p.batch, 8) * 8
        counters = p.heads * b8 * grid_mma.exchange_words(p) + p.heads * (b8 // 8)
        if uw == 4:
            streamed = max(grid_mma.streamed_bytes(p, 4, b) for b in (False, True))
            region = p.heads * grid_mma.blocks_per_head(p, 4) * streamed // 4
            assert launch.exchange_buffer_words == cdiv(counters, 4) * 4 + region
            # The streamed part is kept in L2 by a window where L2 does not keep it anyway.
            kept = 4 * region > costs.STREAM_L2_RESIDENT_BYTES
            assert launch.l2_bytes == (4 * region if kept else 0)
            assert launch.l2_from == (cdiv(counters, 4) * 4 if kept else 0)
            kernel = plan.build["kernels"][launch.forward.kernel]
            assert kernel["fw_store"] > 0 and kernel["fw_smem"] <= grid_mma.LIBRARY_SMEM
        else:
            assert launch.exchange_buffer_words == counters
            assert launch.l2_from == launch.l2_bytes == 0
