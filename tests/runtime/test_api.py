"""``rnncc.load`` / ``rnncc.loads`` and ``CompiledCell``: selection, description, defaults,
backends, warnings, edge lengths and dtypes (DESIGN.md §2)."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

import rnncc
from rnncc.runtime.api import CompiledCell, no_out

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"

# States with declared initial values, a param with one, and an unused gate (a warning).
INIT_SRC = """cell inits(h, c = 1.0, m = -inf) {
    gates a, unused = W x + R h + b
    param p = -0.5
    m = max(m, a)
    c = c + p * a
    h = tanh(c + m)
}
"""


def lstm() -> CompiledCell:
    return rnncc.load(EXAMPLES / "lstm.rnn")


def random_inputs(cell: CompiledCell, B=2, T=3, NH=2, D=3, dtype=torch.float64, seed=0):
    """Random ``Wx, R, b`` (None where the cell has no such term)."""
    gen = torch.Generator().manual_seed(seed)
    shapes = cell.shapes(B, T, NH, D)
    return [
        None if shapes[k] is None else torch.randn(shapes[k], generator=gen, dtype=dtype)
        for k in ("Wx", "R", "b")
    ]


@pytest.fixture
def two(tmp_path: Path) -> Path:
    path = tmp_path / "two.rnn"
    path.write_text((EXAMPLES / "elman.rnn").read_text() + (EXAMPLES / "indrnn.rnn").read_text())
    return path


# ---- load / loads ------------------------------------------------------------------------


def test_load_single_cell_from_str_and_path() -> None:
    for path in (EXAMPLES / "gru.rnn", str(EXAMPLES / "gru.rnn")):
        cell = rnncc.load(path)
        assert isinstance(cell, rnncc.CompiledCell)
        assert cell.name == "gru"
        assert cell.ir.source is not None and cell.ir.source.path == str(path)


def test_loads_equals_load() -> None:
    text = (EXAMPLES / "slstm.rnn").read_text()
    assert rnncc.loads(text).ir == rnncc.load(EXAMPLES / "slstm.rnn").ir
    assert rnncc.loads(text).ir.source.path == "<string>"


def test_loads_takes_text_only() -> None:
    data = (EXAMPLES / "gru.rnn").read_bytes()
    with pytest.raises(
        TypeError,
        match=r"^rnncc.loads takes the cell.s source as str, got bytes \(decode them first\)$",
    ):
        rnncc.loads(data)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"got PosixPath \(rnncc.load reads a file\)$"):
        rnncc.loads(EXAMPLES / "gru.rnn")  # type: ignore[arg-type]
    assert rnncc.loads(data.decode()).name == "gru"


def test_load_selects_a_cell(two: Path) -> None:
    assert rnncc.load(two, cell="indrnn").name == "indrnn"
    assert rnncc.load(two, cell="elman").name == "elman"
    assert rnncc.loads(two.read_text(), cell="indrnn").ir == rnncc.load(two, "indrnn").ir


def test_load_several_cells_without_cell(two: Path) -> None:
    with pytest.raises(ValueError) as err:
        rnncc.load(two)
    assert str(err.value) == (
        f"{two} defines several cells (elman, indrnn); choose one with cell='name'"
    )
    with pytest.raises(ValueError) as err:
        rnncc.loads(two.read_text())
    assert str(err.value) == (
        "<string> defines several cells (elman, indrnn); choose one with cell='name'"
    )


def test_load_unknown_cell(two: Path) -> None:
    with pytest.raises(ValueError) as err:
        rnncc.load(two, cell="lstm")
    assert str(err.value) == f"{two} has no cell named 'lstm'; it defines: elman, indrnn"
    with pytest.raises(ValueError) as err:
        rnncc.loads((EXAMPLES / "gru.rnn").read_text(), cell="lstm")
    assert str(err.value) == "<string> has no cell named 'lstm'; it defines: gru"


def test_loads_bad_source_raises_dsl_error() -> None:
    with pytest.raises(rnncc.DslError) as err:
        rnncc.loads("cell bad(h) {\n    gates a = W x\n    h = q + a * r\n}\n", path="bad.rnn")
    assert [d.message for d in err.value.diagnostics] == [
        "unknown name 'q'",
        "unknown name 'r'",
    ]
    assert str(err.value).startswith("bad.rnn:3:9: error: unknown name 'q'\n")


def test_loads_emits_cell_warnings() -> None:
    with pytest.warns(rnncc.RnnccWarning) as record:
        cell = rnncc.loads(INIT_SRC, path="inits.rnn")
    assert [str(w.message) for w in record] == [
        "inits.rnn:2:14: warning: gate 'unused' is never used\n"
        "        gates a, unused = W x + R h + b\n"
        "                 ^~~~~~"
    ]
    assert record[0].filename == __file__  # attributed to the caller of loads
    assert [d.message for d in cell.warnings] == ["gate 'unused' is never used"]
    assert issubclass(rnncc.RnnccWarning, UserWarning)


def test_clean_cell_emits_no_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cell = lstm()
    assert cell.warnings == ()


# ---- description -------------------------------------------------------------------------


def test_lstm_attributes() -> None:
    cell = lstm()
    assert cell.state_names == ("h", "c")
    assert cell.gx_names == cell.gr_names == cell.gb_names == ("i", "f", "z", "o")
    assert cell.param_names == ()
    assert cell.outputs == ("h",)
    assert repr(cell) == (
        "CompiledCell(lstm: states=['h', 'c'], Wx gates=['i', 'f', 'z', 'o'], "
        "R gates=['i', 'f', 'z', 'o'], b gates=['i', 'f', 'z', 'o'], outputs=['h'])"
    )


def test_gru_gate_order_follows_statements() -> None:
    cell = rnncc.load(EXAMPLES / "gru.rnn")
    assert cell.gx_names == ("xr", "xz", "xn")  # `input xr, xz, xn = W x`
    assert cell.gr_names == ("hr", "hz", "hn")  # `recurrent hr, hz, hn = R h + b`
    assert cell.gb_names == ("hr", "hz", "hn")
    assert cell.state_names == ("h",) and cell.outputs == ("h",)


def test_gate_order_of_b_in_an_input_statement() -> None:
    cell = rnncc.load(EXAMPLES / "mgu.rnn")  # `input xf, xn = W x + b`, `recurrent hf, hn = R h`
    assert (cell.gx_names, cell.gr_names, cell.gb_names) == (
        ("xf", "xn"),
        ("hf", "hn"),
        ("xf", "xn"),
    )
    sru = rnncc.load(EXAMPLES / "sru.rnn")  # input z; gates f, r (+ b); input xs
    assert (sru.gx_names, sru.gr_names, sru.gb_names) == (("z", "f", "r", "xs"), (), ("f", "r"))
    assert sru.param_names == ("v_f", "v_r") and sru.outputs == ("h",)


def test_shapes() -> None:
    assert lstm().shapes(2, 5, 3, 4) == {
        "Wx": (2, 5, 4, 3, 4),
        "R": (4, 3, 4, 4),
        "b": (4, 3, 4),
        "states": (2, 2, 3, 4),
        "params": None,
        "y": (1, 2, 5, 3, 4),
        "last": (2, 2, 3, 4),
    }
    assert rnncc.load(EXAMPLES / "peephole_lstm.rnn").shapes(2, 5, 3, 4)["y"] == (2, 2, 5, 3, 4)
    assert rnncc.load(EXAMPLES / "indrnn.rnn").shapes(2, 5, 3, 4) == {
        "Wx": (2, 5, 1, 3, 4),
        "R": None,
        "b": (1, 3, 4),
        "states": (1, 2, 3, 4),
        "params": (1, 3, 4),
        "y": (1, 2, 5, 3, 4),
        "last": (1, 2, 3, 4),
    }
    lru = rnncc.load(EXAMPLES / "lru.rnn").shapes(1, 1, 1, 1)
    assert lru["R"] is None and lru["b"] is None
    for args, message in (
        ((-1, 5, 3, 4), "B must be a non-negative int, got -1"),
        ((2, 2.5, 3, 4), "T must be a non-negative int, got 2.5"),
        ((2, 5, True, 4), "NH must be a non-negative int, got True"),
    ):
        with pytest.raises(ValueError) as err:
            lstm().shapes(*args)
        assert str(err.value) == message


def test_source_and_backward_source() -> None:
    cell = lstm()
    assert rnncc.loads(cell.source()).ir == cell.ir
    assert "backward lstm {\n" in cell.backward_source()


# ---- defaults ----------------------------------------------------------------------------


def test_initial_states_use_declared_values() -> None:
    with pytest.warns(rnncc.RnnccWarning):
        cell = rnncc.loads(INIT_SRC)
    s = cell.initial_states(2, 3, 4)
    assert s.shape == (3, 2, 3, 4) and s.dtype == torch.float32
    assert torch.equal(s[0], torch.zeros(2, 3, 4))
    assert torch.equal(s[1], torch.ones(2, 3, 4))
    assert torch.equal(s[2], torch.full((2, 3, 4), -torch.inf))
    assert cell.initial_states(1, 1, 1, dtype=torch.bfloat16).dtype == torch.bfloat16
    assert torch.equal(cell.initial_params(3, 4), torch.full((1, 3, 4), -0.5))
    slstm = rnncc.load(EXAMPLES / "slstm.rnn")
    assert torch.equal(slstm.initial_states(2, 1, 3), torch.zeros(4, 2, 1, 3))
    assert lstm().initial_params(1, 1) is None
    indrnn = rnncc.load(EXAMPLES / "indrnn.rnn")
    assert torch.equal(
        indrnn.initial_params(2, 3, dtype=torch.float64),
        torch.full((1, 2, 3), 0.5, dtype=torch.float64),
    )


def test_default_states_and_params_are_the_declared_values() -> None:
    with pytest.warns(rnncc.RnnccWarning):
        cell = rnncc.loads(INIT_SRC)
    Wx, R, b = random_inputs(cell)
    y, last = cell(Wx, R, b)
    states = cell.initial_states(2, 2, 3, dtype=torch.float64)
    params = cell.initial_params(2, 3, dtype=torch.float64)
    y2, last2 = cell(Wx, R, b, states=states, params=params)
    assert torch.equal(y, y2) and torch.equal(last, last2)
    # and the declared values matter: zeros give another result
    y3, _ = cell(Wx, R, b, states=torch.zeros_like(states), params=torch.zeros_like(params))
    assert not torch.allclose(y, y3)
    assert torch.isfinite(y).all()


def test_default_params_of_an_example() -> None:
    cell = rnncc.load(EXAMPLES / "indrnn.rnn")  # param u = 0.5
    Wx, R, b = random_inputs(cell)
    assert R is None
    y, _ = cell(Wx, None, b)
    y2, _ = cell(Wx, None, b, params=torch.full((1, 2, 3), 0.5, dtype=torch.float64))
    assert torch.equal(y, y2)


def _record_defaults(monkeypatch) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """The (states, params) that each later call hands the reference backend."""
    import rnncc.runtime.api as api

    seen: list[tuple[torch.Tensor, torch.Tensor | None]] = []
    run = api.run_reference

    def recording(cell, bwd, Wx, R, b, states, params, **kw):
        seen.append((states, params))
        return run(cell, bwd, Wx, R, b, states, params, **kw)

    monkeypatch.setattr(api, "run_reference", recording)
    return seen


def test_default_states_and_params_are_kept_across_calls(monkeypatch) -> None:
    # Filling them is a kernel launch each on CUDA, every call: they are made once per size.
    with pytest.warns(rnncc.RnnccWarning):
        cell = rnncc.loads(INIT_SRC)
    seen = _record_defaults(monkeypatch)
    Wx, R, b = random_inputs(cell)
    y, last = cell(Wx, R, b)
    y2, last2 = cell(Wx, R, b)
    (s1, p1), (s2, p2) = seen
    assert s1 is s2 and p1 is p2
    assert torch.equal(y, y2) and torch.equal(last, last2)
    # another size or dtype gets its own
    cell(*random_inputs(cell, B=3))
    cell(*random_inputs(cell, dtype=torch.float32))
    assert seen[2][0] is not s1 and seen[2][1] is p1  # params do not depend on the batch
    assert seen[3][0] is not s1 and seen[3][0].dtype == torch.float32
    assert seen[3][1] is not p1


def test_kept_defaults_equal_the_declared_initial_values() -> None:
    with pytest.warns(rnncc.RnnccWarning):
        cell = rnncc.loads(INIT_SRC)
    Wx, R, b = random_inputs(cell)
    for _ in range(2):  # made, then kept
        y, last = cell(Wx, R, b)
        states = cell.initial_states(2, 2, 3, dtype=torch.float64)
        params = cell.initial_params(2, 3, dtype=torch.float64)
        y2, last2 = cell(Wx, R, b, states=states, params=params)
        assert torch.equal(y, y2) and torch.equal(last, last2)


def test_initial_states_and_params_are_fresh_tensors_the_caller_may_change() -> None:
    with pytest.warns(rnncc.RnnccWarning):
        cell = rnncc.loads(INIT_SRC)
    Wx, R, b = random_inputs(cell)
    y, last = cell(Wx, R, b)
    for make in (
        lambda: cell.initial_states(2, 2, 3, dtype=torch.float64),
        lambda: cell.initial_params(2, 3, dtype=torch.float64),
    ):
        t1, t2 = make(), make()
        assert t1 is not t2 and t1.data_ptr() != t2.data_ptr()
        t1.fill_(7.0)
    y2, last2 = cell(Wx, R, b)
    assert torch.equal(y, y2) and torch.equal(last, last2)


def test_the_kept_states_are_never_returned() -> None:
    cell = lstm()
    Wx, R, b = random_inputs(cell, T=0)  # the last states are the initial ones
    _, last = cell(Wx, R, b)
    last.fill_(5.0)
    _, last = cell(Wx, R, b)
    assert torch.equal(last, torch.zeros(2, 2, 2, 3, dtype=torch.float64))


def test_kept_defaults_are_bounded_and_the_most_recent_stay(monkeypatch) -> None:
    from rnncc.runtime.api import DEFAULTS_KEPT

    cell = lstm()
    seen = _record_defaults(monkeypatch)
    sizes = range(1, 2 * DEFAULTS_KEPT + 1)
    for B in sizes:
        cell(*random_inputs(cell, B=B, T=1))
        assert len(cell._defaults) == min(B, DEFAULTS_KEPT)
    first = {B: s for B, (s, _) in zip(sizes, seen, strict=True)}
    seen.clear()
    oldest_kept = sizes[-DEFAULTS_KEPT]
    cell(*random_inputs(cell, B=oldest_kept, T=1))  # kept; now the most recently used
    cell(*random_inputs(cell, B=sizes[0], T=1))  # dropped: made again, dropping another
    cell(*random_inputs(cell, B=oldest_kept, T=1))  # still kept
    assert seen[0][0] is first[oldest_kept]
    assert seen[1][0] is not first[sizes[0]]
    assert seen[2][0] is first[oldest_kept]
    assert len(cell._defaults) == DEFAULTS_KEPT


@pytest.mark.parametrize("how", ["compiling", "dispatch mode"])
def test_defaults_are_neither_kept_nor_used_while_tracing(monkeypatch, how: str) -> None:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    cell = lstm()
    seen = _record_defaults(monkeypatch)
    Wx, R, b = random_inputs(cell)
    y, _ = cell(Wx, R, b)
    kept = dict(cell._defaults)
    if how == "compiling":
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
        y2, _ = cell(Wx, R, b)
        y3, _ = cell(Wx, R, b)
    else:
        with Passthrough():
            y2, _ = cell(Wx, R, b)
            y3, _ = cell(Wx, R, b)
    assert dict(cell._defaults) == kept
    states = [s for s, _ in seen]
    assert states[1] is not states[0] and states[2] is not states[1]
    assert torch.equal(y2, y) and torch.equal(y3, y)


def test_defaults_are_not_kept_while_a_cuda_stream_captures(monkeypatch) -> None:
    from rnncc.runtime.api import _may_keep

    def no_cuda_here() -> bool:
        raise AssertionError("asked about CUDA graph capture for a CPU tensor")

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", no_cuda_here)
    assert _may_keep(on_cuda=False)  # a CPU call never touches CUDA
    for capturing in (True, False):
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda c=capturing: c)
        assert _may_keep(on_cuda=True) is not capturing


def test_defaults_kept_in_inference_mode_serve_a_later_backward() -> None:
    # A tensor made in inference mode could not be saved for a later call's backward.
    cell = rnncc.load(EXAMPLES / "indrnn.rnn")  # param u = 0.5: saved for backward
    Wx, R, b = random_inputs(cell)
    with torch.inference_mode():
        cell(Wx, R, b)
    grads = []
    for params in (None, cell.initial_params(2, 3, dtype=torch.float64)):
        x = Wx.clone().requires_grad_()
        y, last = cell(x, R, b, params=params)
        (y.sum() + last.sum()).backward()
        grads.append(x.grad)
    assert torch.equal(*grads)


# ---- backends ----------------------------------------------------------------------------


def test_auto_runs_the_reference_on_cpu() -> None:
    cell = lstm()
    assert cell.last_backend is None
    Wx, R, b = random_inputs(cell)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no slow-fallback warning on CPU
        y, last = cell(Wx, R, b)
    assert cell.last_backend == "reference"
    y2, last2 = cell(Wx, R, b, backend="reference")
    assert cell.last_backend == "reference"
    assert torch.equal(y, y2) and torch.equal(last, last2)


@pytest.mark.parametrize("backend", ["stepwise", "fused"])
def test_cuda_backends_need_cuda_tensors(backend: str) -> None:
    cell = lstm()
    with pytest.raises(ValueError) as err:
        cell(*random_inputs(cell), backend=backend)
    assert str(err.value) == (
        f"backend='{backend}' runs on CUDA tensors; Wx is on cpu (use backend='reference' on the CPU)"
    )
    assert cell.last_backend is None


def _cuda_like(dtype: torch.dtype = torch.bfloat16) -> Any:
    """Stands in for a CUDA tensor where only its device, dtype and ``is_cuda`` are read."""
    return SimpleNamespace(device=torch.device("cuda", 0), dtype=dtype, is_cuda=True)


def _on_h100(cell: CompiledCell, monkeypatch) -> CompiledCell:
    """``cell`` planning for an H100 SXM's caps (no GPU here; the plan needs only its caps)."""
    from rnncc.tiling import caps_for_arch

    monkeypatch.setattr(cell, "_caps", lambda device: caps_for_arch("h100"))
    return cell


def _sizes(B: int, NH: int, D: int) -> Any:
    from rnncc.runtime.validate import Sizes

    return Sizes(B, 1, NH, D)


def test_a_call_solves_its_plan_once_per_size_and_dtype(monkeypatch) -> None:
    # Every call asks for its plan: it is solved once per (device, dtype, sizes, backend).
    import rnncc.tiling as tiling

    asked = []
    real = tiling.solve
    monkeypatch.setattr(tiling, "solve", lambda p, *a: asked.append(p.describe()) or real(p, *a))
    cell = _on_h100(lstm(), monkeypatch)
    for _ in range(3):
        assert cell._choose("auto", _cuda_like(), _sizes(16, 12, 64)).variant == "block_mma"
        assert cell._choose("auto", _cuda_like(torch.float32), _sizes(16, 12, 64)).fused
    assert asked == ["Gr=4, NH=12, D=64, B=16, bf16", "Gr=4, NH=12, D=64, B=16, fp32"]


def test_a_cuda_call_keeps_its_plan_by_what_decides_it(monkeypatch) -> None:
    """A CUDA call without a mask plans once per (backend, device, dtype, B, NH, D, timeline);
    T does not enter; a call with a mask, or one that torch.compile traces, looks its plan up
    each time."""
    cell = _on_h100(lstm(), monkeypatch)
    planned: list[tuple] = []
    real = cell._choose

    def choose(backend, Wx, sizes, timeline=False, mask=None):
        planned.append((backend, Wx.dtype, sizes.B, timeline, mask is not None))
        return real(backend, Wx, sizes, timeline)

    monkeypatch.setattr(cell, "_choose", choose)
    Sizes = type(_sizes(1, 1, 1))
    for T in (1, 5, 1):
        plan = cell._call_plan("auto", _cuda_like(), Sizes(16, T, 12, 64), False, None)
        assert plan.variant == "block_mma"
    cell._call_plan("auto", _cuda_like(), Sizes(8, 1, 12, 64), False, None)
    cell._call_plan("auto", _cuda_like(), Sizes(16, 1, 12, 64), True, None)
    cell._call_plan("fused", _cuda_like(), Sizes(16, 1, 12, 64), False, None)
    cell._call_plan("auto", _cuda_like(torch.float32), Sizes(16, 1, 12, 64), False, None)
    assert planned == [
        ("auto", torch.bfloat16, 16, False, False),
        ("auto", torch.bfloat16, 8, False, False),
        ("auto", torch.bfloat16, 16, True, False),
        ("fused", torch.bfloat16, 16, False, False),
        ("auto", torch.float32, 16, False, False),
    ]
    planned.clear()
    mask = torch.ones(4, 12, 64, 64, dtype=torch.bool)
    for _ in range(2):
        cell._call_plan("auto", _cuda_like(), Sizes(16, 1, 12, 64), False, mask)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    for _ in range(2):
        cell._call_plan("auto", _cuda_like(), Sizes(4, 1, 12, 64), False, None)
    assert [(b, m) for _, _, b, _, m in planned] == [(16, True), (16, True), (4, False), (4, False)]


def test_fused_backend_names_the_constraints_it_hits(monkeypatch) -> None:
    cell = _on_h100(lstm(), monkeypatch)
    plan = cell._choose("fused", _cuda_like(), _sizes(16, 1, 65))
    assert plan.variant == "grid_mma"
    assert cell._choose("fused", _cuda_like(torch.float32), _sizes(16, 1, 65)).variant == "grid_mma"
    with pytest.raises(rnncc.TilingError) as err:
        cell._choose("fused", _cuda_like(torch.float32), _sizes(16, 1, 1025))
    lines = str(err.value).splitlines()
    assert lines[0] == (
        "cell 'lstm': no fused kernel for head dim 1025: no kernel variant runs Gr=4, NH=1, "
        "D=1025, B=16, fp32 on NVIDIA H100 SXM (132 SMs)"
    )
    assert lines[-4:] == [
        "  grid_mma: ruled out by",
        "    narrow_blocks_fit_registers: narrow blocks (8 units, R in registers) only up to head "
        "dim 1024",
        "  block_mma, grid_stream, grid_sparse: store fp16 and bf16 only, not fp32",
        "use backend='stepwise' (or 'auto')",
    ]
    assert cell._choose("fused", _cuda_like(), _sizes(16, 1, 2048)).variant == "grid_mma"
    assert cell._choose("fused", _cuda_like(), _sizes(16, 1, 4096)).variant == "grid_stream"
    with pytest.raises(rnncc.TilingError, match="head_blocks_co_resident"):
        cell._choose("fused", _cuda_like(), _sizes(16, 1, 8192))
    with pytest.raises(ValueError, match=r"got torch\.float64"):
        cell.plan(16, 1, 64, torch.float64)


def test_auto_picks_the_cheapest_variant_and_warns_once_where_that_is_stepwise(
    monkeypatch,
) -> None:
    cell = _on_h100(lstm(), monkeypatch)
    assert cell._choose("auto", _cuda_like(), _sizes(16, 1, 64)).variant == "block_mma"
    assert cell._choose("auto", _cuda_like(), _sizes(16, 1, 768)).variant == "grid_mma"
    with pytest.warns(rnncc.RnnccWarning, match=r"no fused kernel for head dim 8192 \(") as w:
        assert cell._choose("auto", _cuda_like(), _sizes(16, 1, 8192)).variant == "stepwise"
    assert "head_blocks_co_resident" in str(w[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cell._choose("auto", _cuda_like(), _sizes(16, 1, 8192)).variant == "stepwise"
    with pytest.warns(rnncc.RnnccWarning, match="reference backend"):
        assert cell._choose("auto", _cuda_like(torch.float64), _sizes(16, 1, 64)) is None


def test_the_plan_method_is_what_a_call_runs(monkeypatch) -> None:
    cell = _on_h100(lstm(), monkeypatch)
    plan = cell.plan(64, 1, 768, device="cuda:0")
    assert plan is cell._choose("auto", _cuda_like(), _sizes(64, 1, 768))
    assert plan.summary() == (
        "grid_mma (n_tiles=4, unit_tiles=2, blocks_per_sm=1): forward kernel 3: 48×1×2 blocks of 384 threads, "
        "98304 B dynamic shared memory"
    )
    assert cell.plan(64, 1, 768, device="cuda:0", backend="stepwise").variant == "stepwise"


def test_plan_checks_density_and_mask(monkeypatch) -> None:
    cell = _on_h100(lstm(), monkeypatch)
    for density, message in (
        (2, "density must be in (0, 1], got 2"),
        (0, "density must be in (0, 1], got 0"),
        (float("nan"), "density must be in (0, 1], got nan"),
        ("0.5", "density must be a number in (0, 1], got '0.5'"),
    ):
        with pytest.raises(ValueError) as err:
            cell.plan(16, 1, 64, device="cuda:0", density=density)
        assert str(err.value) == message
    with pytest.raises(ValueError, match=r"^mask has dtype torch.float32, expected torch.bool"):
        cell.plan(16, 1, 64, device="cuda:0", mask=torch.ones(4, 1, 64, 64))
    with pytest.raises(
        ValueError, match=r"^mask has shape \[4, 1, 64, 32\], expected \[4, 1, 64, 64\]"
    ):
        cell.plan(16, 1, 64, device="cuda:0", mask=torch.ones(4, 1, 64, 32, dtype=torch.bool))
    ok = torch.zeros(4, 1, 64, 64, dtype=torch.bool)
    ok[..., :16] = True  # a quarter kept: planned as that density is
    assert cell.plan(16, 1, 64, device="cuda:0", mask=ok) is not None
    assert cell.plan(16, 1, 64, device="cuda:0", density=np.float32(0.25)) is not None


def test_plan_and_prepare_need_cuda() -> None:
    cell = lstm()
    for call, what in (
        (lambda d: cell.plan(2, 1, 32, device=d), "cell.plan"),
        (lambda d: cell.prepare(d, 32), "cell.prepare"),
    ):
        with pytest.raises(ValueError, match=rf"^{what} is for a CUDA device, got cpu: on the CPU"):
            call("cpu")
        if not torch.cuda.is_available():  # torch's own is a bare AssertionError
            with pytest.raises(ValueError, match=r"^CUDA is not available in this process"):
                call("cuda")


def test_invalid_backend() -> None:
    cell = lstm()
    with pytest.raises(ValueError) as err:
        cell(*random_inputs(cell), backend="cuda")
    assert str(err.value) == "backend must be one of auto, reference, stepwise, fused; got 'cuda'"


# ---- lengths and dtypes ------------------------------------------------------------------


def test_t0_returns_the_initial_states() -> None:
    cell = lstm()
    Wx, R, b = random_inputs(cell, T=0)
    y, last = cell(Wx, R, b)
    assert y.shape == (1, 2, 0, 2, 3) and y.dtype == torch.float64
    assert torch.equal(last, torch.zeros(2, 2, 2, 3, dtype=torch.float64))

    states = torch.randn(2, 2, 2, 3, dtype=torch.float64, requires_grad=True)
    Wx.requires_grad_()
    y, last = cell(Wx, R, b, states=states)
    assert torch.equal(last, states)
    last.sum().backward()
    assert torch.equal(states.grad, torch.ones_like(states))
    assert Wx.grad.shape == Wx.shape


def test_t1_is_one_lstm_step() -> None:
    cell = lstm()
    Wx, R, b = random_inputs(cell, B=3, T=1, NH=2, D=4)
    states = torch.randn(2, 3, 2, 4, dtype=torch.float64)
    y, last = cell(Wx, R, b, states=states)
    h0, c0 = states
    g = Wx[:, 0] + torch.einsum("gnde,bne->gbnd", R, h0).movedim(0, 1) + b
    i, f, z, o = g.unbind(1)
    c = torch.sigmoid(f) * c0 + torch.sigmoid(i) * torch.tanh(z)
    h = torch.sigmoid(o) * torch.tanh(c)
    torch.testing.assert_close(last, torch.stack([h, c]))
    torch.testing.assert_close(y, h[None, :, None])


@pytest.mark.parametrize(
    ("dtype", "tol"),
    [(torch.float32, 1e-5), (torch.bfloat16, 3e-2), (torch.float16, 5e-3), (torch.float64, 0.0)],
)
def test_dtypes(dtype: torch.dtype, tol: float) -> None:
    cell = rnncc.load(EXAMPLES / "peephole_lstm.rnn")
    inputs = [t.to(dtype) for t in random_inputs(cell, T=4)]
    params = torch.full((3, 2, 3), 0.25, dtype=dtype)
    y, last = cell(*inputs, params=params)
    assert (y.dtype, last.dtype) == (dtype, dtype)
    assert y.shape == (2, 2, 4, 2, 3) and last.shape == (2, 2, 2, 3)
    # against float64 on the same (rounded) inputs
    y64, last64 = cell(*[t.double() for t in inputs], params=params.double())
    for got, want in ((y, y64), (last, last64)):
        err = (got.double() - want).norm() / want.norm()
        assert err <= tol, (dtype, err)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_gradients_keep_the_dtype(dtype: torch.dtype) -> None:
    cell = lstm()
    Wx, R, b = (t.to(dtype).requires_grad_() for t in random_inputs(cell))
    y, last = cell(Wx, R, b)
    (y.float().sum() + last.float().sum()).backward()
    assert (Wx.grad.dtype, R.grad.dtype, b.grad.dtype) == (dtype, dtype, dtype)


def test_load_warnings_are_attributed_to_the_caller(tmp_path: Path) -> None:
    path = tmp_path / "inits.rnn"
    path.write_text(INIT_SRC)
    with pytest.warns(rnncc.RnnccWarning) as record:
        rnncc.load(path)
    assert record[0].filename == __file__


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.rnn")), ids=lambda p: p.stem)
def test_a_cell_pickles_and_copies_to_the_same_results(path, how):
    import copy
    import pickle

    from rnncc.testing import random_inputs

    cell = rnncc.load(path)
    x = random_inputs(cell.ir, 2, 3, 2, 4, seed=4)
    inputs = [x[k] for k in ("Wx", "R", "b", "states", "params")]
    y, last = cell(*inputs)  # kept default tensors and the chosen backend are per process
    clone = pickle.loads(pickle.dumps(cell)) if how == "pickle" else copy.deepcopy(cell)
    assert clone is not cell and clone.ir == cell.ir and clone.backward_ir == cell.backward_ir
    assert clone.source() == cell.source() and clone.ir.source == cell.ir.source
    y2, last2 = clone(*inputs)
    assert torch.equal(y, y2) and torch.equal(last, last2)
    # The declared initial states and params, kept per process, come back lazily.
    assert torch.equal(clone(*inputs[:3])[0], cell(*inputs[:3])[0])


def test_ir_nodes_pickle():
    import pickle

    cell = rnncc.load(EXAMPLES / "slstm.rnn")
    roots = [n for _, n in cell.ir.updates]
    again = pickle.loads(pickle.dumps(roots))
    assert again == roots and [n.name for n in again] == [n.name for n in roots]


def test_step_out_needs_the_decoding_kernel() -> None:
    """out= is written by the decoding kernel (CUDA, no gradient); elsewhere it is refused
    rather than ignored."""
    cell = rnncc.load(Path(__file__).resolve().parents[2] / "examples" / "lstm.rnn")
    Wx, s = torch.zeros(2, 4, 1, 3), torch.zeros(2, 2, 1, 3)
    R, b = torch.zeros(4, 1, 3, 3), torch.zeros(4, 1, 3)
    with pytest.raises(
        ValueError,
        match=r"^out= is for steps that run the decoding kernel, and the step runs on cpu",
    ):
        cell.step(Wx, R, b, s, out=(torch.empty(1, 2, 1, 3), torch.empty(2, 2, 1, 3)))
    # each reason the decoding kernel does not run, as the message says it
    cuda = torch.device("cuda")
    assert str(no_out("fused", cuda, torch.float64)).endswith("it has no torch.float64 build")
    assert str(no_out("auto", cuda, torch.bfloat16)).endswith(
        "this step records gradients: call step under torch.no_grad()"
    )
    assert str(no_out("reference", cuda, torch.bfloat16)).endswith(
        "the step runs on cuda with backend='reference'; it is a CUDA kernel"
    )


@pytest.mark.parametrize(
    "out, message",
    [
        (None, "out must be a tuple of 2 tensors [O, B], [S, B], got None"),
        (
            (torch.empty(2, 3), torch.empty(2, 3)),
            "out[0] has shape [2, 3], expected [1, 3] ([O, B], [S, B])",
        ),
        (
            (torch.empty(1, 3), torch.empty(2, 3, dtype=torch.float64)),
            "out[1] must be a contiguous torch.float32 tensor on cpu; got torch.float64 on cpu",
        ),
        (
            (torch.empty(1, 3), torch.empty(3, 2).t()),
            "out[1] must be a contiguous torch.float32 tensor on cpu; got torch.float32 on cpu, "
            "not contiguous",
        ),
    ],
)
def test_out_buffers_are_checked(out, message) -> None:
    from rnncc.runtime.api import check_out

    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        like = {"dtype": torch.float32, "device": torch.device("cpu")}
        check_out(out, ((1, 3), (2, 3)), like, "[O, B], [S, B]")


@pytest.mark.parametrize("transform", ["grad", "vmap"])
def test_torch_func_transforms_are_refused_naming_the_call(transform: str) -> None:
    # torch's own error from inside the backends' autograd Functions names none of rnncc's
    # API (it asks for a setup_context): the call says what it does not support instead.
    cell = lstm()
    Wx, R, b = random_inputs(cell)

    def sequence(Wx: torch.Tensor) -> torch.Tensor:
        return cell(Wx, R, b)[0].sum()

    def one_step(Wx: torch.Tensor) -> torch.Tensor:
        return cell.step(Wx[:, 0], R, b)[0].sum()

    apply = torch.func.grad if transform == "grad" else torch.func.vmap
    arg = Wx if transform == "grad" else Wx.unsqueeze(0)  # vmap over a leading axis
    for fn, name in ((sequence, "a cell call"), (one_step, "CompiledCell.step")):
        with pytest.raises(
            NotImplementedError, match=rf"^rnncc: {name} does not run under torch.func.*autograd"
        ):
            apply(fn)(arg)
    # outside a transform the same calls run, and autograd differentiates them
    w = Wx.clone().requires_grad_()
    (sequence(w) + one_step(w)).backward()
    assert w.grad is not None and w.grad.abs().sum() > 0


def test_a_batched_backward_is_refused_naming_the_way_round() -> None:
    """is_grads_batched and vectorized jacobians vmap the backward (torch's older vmap, no
    transform active): torch's error from inside named an in-place copy, nothing of rnncc's."""
    cell = lstm()
    Wx, R, b = random_inputs(cell)
    Wx.requires_grad_()
    y, _ = cell(Wx, R, b)
    message = r"^rnncc: the backward of a cell call does not run batched \(vmap\).*one at a time"
    with pytest.raises(NotImplementedError, match=message):
        torch.autograd.grad(y, Wx, torch.randn(4, *y.shape, dtype=y.dtype), is_grads_batched=True)
    with pytest.raises(NotImplementedError, match=message):
        torch.autograd.functional.jacobian(lambda w: cell(w, R, b)[0], Wx, vectorize=True)
    rows = torch.autograd.functional.jacobian(lambda w: cell(w, R, b)[0], Wx)  # row by row
    assert rows.shape == (*y.shape, *Wx.shape)


def test_autocast_does_not_lower_a_reference_call() -> None:
    """float32 inputs compute in float32 on the reference backend, as on the CUDA ones (the
    einsum of R·h ran in bf16 under CPU autocast: relative error 1e-3)."""
    cell = lstm()
    Wx, R, b = random_inputs(cell, dtype=torch.float32)
    y, last = cell(Wx, R, b)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_auto, last_auto = cell(Wx, R, b)
    assert y_auto.dtype == torch.float32
    torch.testing.assert_close((y_auto, last_auto), (y, last), rtol=0, atol=0)
