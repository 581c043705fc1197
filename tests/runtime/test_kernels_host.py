"""CPU-side checks of the kernels' ops: their schemas and fake implementations (both hosts),
and the generic host loop compiling against the installed torch headers."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import rnncc
from rnncc.resources import templates_dir
from rnncc.runtime.kernels import _define_ops

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("host", ["stepwise", "fused"])
@pytest.mark.parametrize("save", [True, False])
def test_fake_forward_and_backward_shapes(save, host):
    cell = rnncc.load(ROOT / "examples" / "peephole_lstm.rnn")
    ir = cell.ir
    rec = ir.state_names.index(ir.recurrent)
    dims = [
        len(ir.states),
        len(ir.outputs),
        len(ir.gx_names),
        len(ir.gr_names),
        len(ir.gb_names),
        len(ir.params),
        rec,
    ]
    name = f"fake_probe_{host}_{save}"
    fwd = _define_ops(name, 0, 0, dims, host).op
    launch = [] if host == "stepwise" else [0] * 14
    B, T, NH, D = 2, 5, 3, 4
    s = cell.shapes(B, T, NH, D)
    with FakeTensorMode():
        x = {
            k: None if s[k] is None else torch.empty(s[k])
            for k in ("Wx", "R", "b", "states", "params")
        }
        y, last, hist, rh = fwd(
            x["Wx"], x["R"], x["b"], x["states"], x["params"], None, False, launch, save, False
        )
        assert y.shape == s["y"] and last.shape == s["last"]
        if save:
            assert hist.shape == (T + 1, len(ir.states), NH, B, D) and hist.dtype == torch.float32
            assert rh.shape == (T, NH, B, len(ir.gr_names) * D)
        else:
            assert hist.numel() == 0 and rh.numel() == 0
        bwd = getattr(torch.ops.rnncc, f"{name}_backward")
        args = (y, last, x["Wx"], x["R"], x["b"], x["params"], None, False, hist, rh, launch)
        dWx, dR, db, dst, dp = bwd(*args, False, False)
        assert (dWx.shape, dR.shape, db.shape, dst.shape, dp.shape) == (
            s["Wx"],
            s["R"],
            s["b"],
            s["states"],
            s["params"],
        )
        # defer_dR: the gate cotangents in dR's place
        assert bwd(*args, False, True)[1].shape == (NH, T, B, len(ir.gr_names) * D)


@pytest.mark.slow
def test_host_loop_compiles_against_torch_headers(tmp_path):
    """Syntax-checks templates/stepwise_host.cpp with g++ and the installed torch headers (a
    CPU build of torch lacks one generated CUDA header, stubbed here)."""
    gxx, cuda_home = shutil.which("g++"), os.environ.get("CUDA_HOME", "/usr/local/cuda")
    if gxx is None or not (Path(cuda_home) / "include" / "cuda_runtime.h").exists():
        if os.environ.get("CI"):
            pytest.fail("CI needs g++ and the CUDA headers to check the host loop")
        pytest.skip("g++ or the CUDA headers are missing")
    from torch.utils.cpp_extension import include_paths

    stub = tmp_path / "c10" / "cuda" / "impl"
    stub.mkdir(parents=True)
    (stub / "cuda_cmake_macros.h").write_text("#pragma once\n")
    cmd = [gxx, "-fsyntax-only", "-std=c++17", "-Wall", f"-I{tmp_path}"]
    cmd += [f"-isystem{p}" for p in include_paths()] + [f"-isystem{cuda_home}/include"]
    cmd += [f"-I{templates_dir()}", str(templates_dir() / "stepwise_host.cpp")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr


def test_a_second_differentiation_of_the_kernels_backward_raises():
    """The CUDA backends' backward is not differentiable: gradients made with create_graph=True
    carry their first-order values, and differentiating them again raises instead of silently
    dropping every term through the kernels (as the wrapped op has no autograd of its own)."""
    from rnncc.runtime.kernels import _first_order_only

    x = torch.randn(3, requires_grad=True)
    g = (2 * x).detach()  # what the kernels' backward returns: no graph
    wrapped, none = _first_order_only("fused", (None, x), (g, None))
    assert none is None and torch.equal(wrapped, g) and wrapped.requires_grad
    penalty = (wrapped**2).sum()
    with pytest.raises(RuntimeError, match=r"fused backend's backward is not differentiable"):
        penalty.backward()
    # Nothing to differentiate (no input requires grad): the gradients are returned as they are.
    assert _first_order_only("fused", (None, x.detach()), (g, None))[0] is g


def test_only_eager_calls_on_plain_tensors_skip_the_registered_op(monkeypatch):
    """An eager call on plain tensors runs the op's CUDA implementation directly when there is
    nothing to differentiate, else the op's autograd as a torch.autograd.Function (less host
    time before a short kernel starts); a call that torch.compile, export or a fake-tensor mode
    traces goes through the registered op."""
    from types import SimpleNamespace

    from rnncc.runtime.kernels import KernelOps, _eager, _Ops

    assert _eager(torch.ones(2))
    with FakeTensorMode():
        assert not _eager(torch.ones(2))
    assert not _eager(torch.nn.Parameter(torch.ones(2)))

    seen: list[tuple[str, bool]] = []

    def way(name: str):
        return lambda *a: seen.append((name, a[8])) or ("y", "last", None, None)

    ops = KernelOps.__new__(KernelOps)
    ops.build, ops.poison = {"variant": "block_mma"}, False
    ops._run = _Ops(way("op"), way("impl"), way("recorded"))
    launch = SimpleNamespace(as_list=lambda: [0] * 16)
    Wx, R = torch.ones(1, 2, 4, 1, 3), torch.ones(4, 1, 3, 3)
    assert ops(Wx, R, None, Wx, None, launch) == ("y", "last")
    assert ops(Wx, R.requires_grad_(), None, Wx, None, launch) == ("y", "last")
    with torch.no_grad():
        ops(Wx, R, None, Wx, None, launch)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    ops(Wx, R, None, Wx, None, launch)
    assert seen == [("impl", False), ("recorded", True), ("impl", False), ("op", True)]


def test_the_recorded_function_saves_and_differentiates_as_the_registered_op(monkeypatch):
    """``_Ops.recorded`` (the eager training path) runs the host library's forward with the
    op's arguments, saves what the backward reads, and returns the backward's gradients for Wx,
    R, b and the states in the op's order (here the host library is a stand-in on the CPU)."""
    from types import SimpleNamespace

    calls: dict[str, tuple] = {}
    S, B, T, NH, D = 2, 2, 3, 1, 4

    def forward(Wx, R, b, states, params, lengths, reverse_from, fn, dims, launch, save, poison):
        calls["forward"] = (reverse_from, fn, dims, launch, save, poison)
        y = Wx[:, :, :1].permute(2, 0, 1, 3, 4).clone()  # [O = 1, B, T, NH, D]
        return y, states.clone(), Wx.new_ones(T + 1), Wx.new_ones(T)

    def backward(dy, dlast, Wx, R, b, params, lengths, reverse_from, hist, rh, fn, dims, *rest):
        calls["backward"] = (dy.shape, dlast.shape, hist.shape, rh.shape, fn, rest)
        return Wx.new_full(Wx.shape, 2.0), R + 3, b + 4, dlast + 5, Wx.new_empty(0)

    monkeypatch.setattr(
        torch.ops, "rnncc_host", SimpleNamespace(fused_forward=forward, fused_backward=backward)
    )
    run = _define_ops("recorded_probe", 11, 22, [S, 1, 4, 4, 4, 0, 0], "fused")
    Wx = torch.randn(B, T, 4, NH, D, requires_grad=True)
    R = torch.randn(4, NH, D, D, requires_grad=True)
    b = torch.randn(4, NH, D, requires_grad=True)
    states = torch.randn(S, B, NH, D, requires_grad=True)
    launch = list(range(16))
    y, last, _, _ = run.recorded(Wx, R, b, states, None, None, 1, launch, True, False)
    assert calls["forward"] == (1, 11, [S, 1, 4, 4, 4, 0, 0], launch, True, False)
    (y.sum() + last.sum()).backward()
    assert calls["backward"] == (y.shape, last.shape, (T + 1,), (T,), 22, (launch, False, False))
    assert torch.equal(Wx.grad, torch.full(Wx.shape, 2.0))
    assert torch.equal(R.grad, R.detach() + 3) and torch.equal(b.grad, b.detach() + 4)
    assert torch.equal(states.grad, torch.full(states.shape, 6.0))  # dlast (ones) + 5

    # dR deferred to another stream (rnncc.RNN's upper layers): the op's node is its context;
    # the backward leaves the gate cotangents (the stand-in's dR slot) for overlap._RGradient
    # and returns no gradient for R.
    from rnncc.runtime.overlap import defer_r_gradient

    R.grad, later = None, {}
    y, last, _, _ = run.recorded(Wx, R, b, states, None, None, 1, launch, True, False)
    defer_r_gradient(y.grad_fn, later)
    (y.sum() + last.sum()).backward()
    assert calls["backward"][-1] == (launch, False, True)
    G, hist, dims = later["G"]
    assert torch.equal(G, R.detach() + 3) and hist.shape == (T + 1,)
    assert dims == [S, 1, 4, 4, 4, 0, 0] and R.grad is None
