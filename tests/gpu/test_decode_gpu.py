"""The decoding kernel (``pytest -m gpu``): ``CompiledCell.step`` and ``RNN.step`` where no
gradient is recorded run one launch per step and layer (R h, the input projection for a layer,
and the cell). Every example against the float64 reference step; stacks against the float64
reference sequence; ``out=`` allocates nothing; a decoding loop with feedback captures in a
CUDA graph; outputs overlapping the states they come from are refused."""

from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from gpu_reference import DTYPES, EXAMPLES, load_examples

import rnncc
from rnncc.testing import TOLERANCES, random_inputs, rel_err

pytestmark = pytest.mark.gpu

#: (B, NH, D): batch chunks of 4 and of 16 rows (and a second chunk), a head dim that is not
#: a multiple of 8 (the kernel's element-wise loads), one that is of 8 but not of 16 (bulk
#: copies of rows whose last k tile the kernel pads with zeros), in a chunk of 8 rows and in
#: a partial one of 16.
SIZES = [(1, 2, 48), (5, 1, 20), (17, 2, 64), (3, 1, 40), (12, 1, 40)]
NAMES = [p.stem for p in EXAMPLES]


@pytest.fixture(scope="module")
def cells():
    loaded = load_examples()
    device = torch.device("cuda", torch.cuda.current_device())
    with ThreadPoolExecutor(8) as ex:  # one build step for every example's library
        list(ex.map(lambda c: c._decoder(device), loaded.values()))
    return loaded


def _step_case(cell, dtype, B, NH, D):
    dt = DTYPES[dtype]
    x64 = random_inputs(cell.ir, B, 1, NH, D, seed=5)
    x = {k: None if v is None else v[:, 0] if k == "Wx" else v for k, v in x64.items()}
    x = {k: None if v is None else v.to("cuda", dt) for k, v in x.items()}
    ref = {k: None if v is None else v.double() for k, v in x.items()}  # the rounded inputs
    with torch.no_grad():
        y, new = cell.step(x["Wx"], x["R"], x["b"], x["states"], x["params"])
    assert cell.last_backend == "decode"
    y_ref, new_ref = cell.step(
        ref["Wx"], ref["R"], ref["b"], ref["states"], ref["params"], backend="reference"
    )
    tol = TOLERANCES[dt]
    assert rel_err(y, y_ref) <= tol, rel_err(y, y_ref)
    assert rel_err(new, new_ref) <= tol, rel_err(new, new_ref)


@pytest.mark.parametrize(("B", "NH", "D"), SIZES, ids=lambda s: str(s))
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("name", NAMES)
def test_decode_step_matches_the_float64_reference(cells, name, dtype, B, NH, D) -> None:
    _step_case(cells[name], dtype, B, NH, D)


@pytest.mark.parametrize("B", [4, 17], ids=["chunk4", "chunk16"])
@pytest.mark.parametrize("name", ["lstm", "gru"])
def test_decode_step_at_768_units(cells, name, B) -> None:
    """A head of 768 units: 16 rows of h need more than 48 KiB of shared memory."""
    _step_case(cells[name], "bf16", B, 1, 768)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_largest_documented_step_fits(dtype) -> None:
    """An LSTM of input size and hidden 1024, 17 rows (two batch chunks): the largest the
    docs say fits the kernel's shared memory on an H100."""
    dt = DTYPES[dtype]
    torch.manual_seed(0)
    layer = rnncc.RNN(rnncc.load_builtin("lstm"), 1024, 1024, device="cuda", dtype=dt)
    ref = copy.deepcopy(layer).double()
    ref.backend = "reference"
    x = torch.randn(17, 1024, device="cuda").to(dt)
    states = torch.randn(2, 1, 17, 1024, device="cuda").to(dt) * 0.5
    with torch.no_grad():
        out, new = layer.step(x, states)
        assert layer.cell.last_backend == "decode"
        out_ref, new_ref = ref(x.double()[:, None], states.double())
    tol = TOLERANCES[dt]
    assert rel_err(out, out_ref[:, 0]) <= tol and rel_err(new, new_ref) <= tol


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("name", ["lstm", "gru", "elman", "peephole_lstm"])
def test_stack_steps_equal_the_reference_sequence(name, dtype) -> None:
    """T steps of a 2-layer stack (the input projection inside the kernel) against the same
    layer over T steps in float64 on the reference backend; the peephole LSTM has two
    outputs (h, c), so a layer's input is both."""
    dt = DTYPES[dtype]
    torch.manual_seed(0)
    cell = rnncc.load(next(p for p in EXAMPLES if p.stem == name))
    layer = rnncc.RNN(cell, 24, 64, num_layers=2, num_heads=2, device="cuda", dtype=dt)
    ref = copy.deepcopy(layer).double()
    ref.backend = "reference"
    x = torch.randn(3, 5, 24, device="cuda").to(dt)
    states = torch.randn(len(layer.cell.state_names), 2, 3, 64, device="cuda").to(dt)
    outs, s = [], states
    with torch.no_grad():
        for t in range(x.shape[1]):
            out, s = layer.step(x[:, t], s)
            outs.append(out)
        assert layer.cell.last_backend == "decode"
        out_ref, last_ref = ref(x.double(), states.double())
    tol = TOLERANCES[dt]
    assert rel_err(torch.stack(outs, 1), out_ref) <= tol
    assert rel_err(s, last_ref) <= tol


def test_out_buffers_allocate_nothing() -> None:
    torch.manual_seed(0)
    layer = rnncc.RNN(
        rnncc.load_builtin("lstm"), 32, 64, num_layers=2, device="cuda", dtype=torch.bfloat16
    )
    cell = layer.cell
    x = torch.randn(4, 32, device="cuda", dtype=torch.bfloat16)
    s0 = torch.randn(2, 2, 4, 64, device="cuda", dtype=torch.bfloat16)
    out, s1 = torch.empty(4, 64, **_like(x)), torch.empty(2, 2, 4, 64, **_like(x))
    w = layer.weights[0]
    Wx = torch.randn(4, 4, 1, 64, **_like(x))
    y, new = torch.empty(1, 4, 1, 64, **_like(x)), torch.empty(2, 4, 1, 64, **_like(x))
    s = s0[:, 0].reshape(2, 4, 1, 64)
    with torch.no_grad():
        for _ in range(2):  # the first builds and warms up
            before = torch.cuda.memory_stats()["allocation.all.allocated"]
            got = layer.step(x, s0, out=(out, s1))
            cell.step(Wx, w.R, w.b, s, out=(y, new))
        assert torch.cuda.memory_stats()["allocation.all.allocated"] == before
    assert got[0] is out and got[1] is s1
    expect = layer.step(x, s0)  # (with gradients: the sequence kernels at T = 1)
    tol = TOLERANCES[torch.bfloat16]
    assert rel_err(out, expect[0]) <= tol and rel_err(s1, expect[1]) <= tol


def test_one_sequence_steps_into_out_buffers() -> None:
    """x_t [input_size] and states without a batch axis on the decoding kernel, into out=
    buffers of those shapes: the batch of one's steps, and nothing allocated."""
    torch.manual_seed(0)
    layer = rnncc.RNN(
        rnncc.load_builtin("lstm"), 32, 64, num_layers=2, device="cuda", dtype=torch.bfloat16
    )
    x = torch.randn(32, device="cuda", dtype=torch.bfloat16)
    s0 = torch.randn(2, 2, 64, device="cuda", dtype=torch.bfloat16)
    out, s1 = torch.empty(64, **_like(x)), torch.empty(2, 2, 64, **_like(x))
    with torch.no_grad():
        for _ in range(2):  # the first builds and warms up
            before = torch.cuda.memory_stats()["allocation.all.allocated"]
            got = layer.step(x, s0, out=(out, s1))
        assert torch.cuda.memory_stats()["allocation.all.allocated"] == before
        assert layer.cell.last_backend == "decode"
        assert got[0] is out and got[1] is s1
        batch_out, batch_new = layer.step(x[None], s0[:, :, None])
    assert torch.equal(out, batch_out[0]) and torch.equal(s1, batch_new[:, :, 0])


def test_decoding_a_stack_with_feedback_captures_in_a_cuda_graph() -> None:
    """x_{t+1} = y_t W: each step's input depends on the last output; two state buffers
    alternate (a step's new states must not be its states)."""
    torch.manual_seed(0)
    H, B, N = 64, 4, 6
    layer = rnncc.RNN(
        rnncc.load_builtin("gru"), H, H, num_layers=2, device="cuda", dtype=torch.bfloat16
    )
    w = torch.randn(H, H, device="cuda", dtype=torch.bfloat16) * 0.1
    x0 = torch.randn(B, H, device="cuda", dtype=torch.bfloat16)
    s0 = torch.randn(1, 2, B, H, device="cuda", dtype=torch.bfloat16)

    def decode(x, a, b, out):
        for t in range(N):
            src, dst = (a, b) if t % 2 == 0 else (b, a)
            layer.step(x, src, out=(out, dst))
            x = out @ w
        return x

    with torch.no_grad():
        a, b, out = s0.clone(), torch.empty_like(s0), torch.empty(B, H, **_like(x0))
        eager = decode(x0, a, b, out), a.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        ga, gb, gout, gx = s0.clone(), torch.empty_like(s0), torch.empty_like(out), x0.clone()
        with torch.cuda.stream(stream):
            decode(gx, ga.clone(), gb, gout)  # warm-up on the capturing stream
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = decode(gx, ga, gb, gout)
        ga.copy_(s0)
        graph.replay()
        torch.cuda.synchronize()
    torch.testing.assert_close(captured, eager[0], rtol=0, atol=0)
    torch.testing.assert_close(ga, eager[1], rtol=0, atol=0)


def test_states_of_any_layout_are_read() -> None:
    """States whose (B, NH, D) part is not contiguous (here head-major) are read as such."""
    cell = rnncc.load_builtin("lstm")
    Wx, R, b, kw = _lstm_step(B=3, NH=2, D=8)
    head_major = torch.randn(2, 2, 3, 8, **kw)  # [S, NH, B, D]
    s = head_major.transpose(1, 2)  # [S, B, NH, D], strided
    with torch.no_grad():
        got = cell.step(Wx, R, b, s)
        want = cell.step(Wx, R, b, s.contiguous())
    assert cell.last_backend == "decode"
    for a, e in zip(got, want, strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=0)


def test_new_states_may_not_overlap_the_states() -> None:
    cell = rnncc.load_builtin("lstm")
    Wx, R, b, kw = _lstm_step(B=2, NH=1, D=8)
    s, y = torch.randn(2, 2, 1, 8, **kw), torch.empty(1, 2, 1, 8, **kw)
    with torch.no_grad(), pytest.raises(RuntimeError, match="must not overlap the states"):
        cell.step(Wx, R, b, s, out=(y, s))


def _lstm_step(B: int, NH: int, D: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """An LSTM step's random bf16 CUDA inputs W x_t, R, b, and their tensor options."""
    kw = _like(torch.empty(0, device="cuda", dtype=torch.bfloat16))
    return (
        torch.randn(B, 4, NH, D, **kw),
        torch.randn(4, NH, D, D, **kw),
        torch.randn(4, NH, D, **kw),
        kw,
    )


def _like(t: torch.Tensor) -> dict:
    return {"device": t.device, "dtype": t.dtype}
