"""RNNCC_DUMP_DIR: every stage of a cell's compilation is written there."""

from __future__ import annotations

from pathlib import Path

import pytest

import rnncc
from rnncc.cli import main
from rnncc.config import ConfigError, override
from rnncc.runtime.kernels import build_kernels
from rnncc.tiling import Problem
from rnncc.variants import BY_NAME

ROOT = Path(__file__).resolve().parents[1]


def test_stages_are_dumped(tmp_path, monkeypatch):
    monkeypatch.setattr("rnncc.runtime.kernels.build_library", lambda *a, **k: tmp_path / "x.so")
    with override(dump_dir=tmp_path):
        cell = rnncc.load(ROOT / "examples" / "gru.rnn")
        problem = Problem.from_cell(cell.ir, heads=1, head_dim=64, batch=16)
        for name in ("stepwise", "block_mma"):
            build = BY_NAME[name].build(problem)
            build_kernels(cell.ir, cell.backward_ir, build, "sm_90a")
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [
        "gru.ast.txt",
        "gru.backward.rnn",
        "gru.block_mma_d64.cu",
        "gru.ir.rnn",
        "gru.stepwise.cu",
    ]
    assert "rnncc::block_mma::forward<Cell>" in (tmp_path / "gru.block_mma_d64.cu").read_text()
    assert "cell gru(h)" in (tmp_path / "gru.ir.rnn").read_text()
    assert "backward gru {" in (tmp_path / "gru.backward.rnn").read_text()
    assert "CellDef" in (tmp_path / "gru.ast.txt").read_text()
    assert "rnncc_forward_step" in (tmp_path / "gru.stepwise.cu").read_text()


def test_plans_are_dumped_named_after_their_problem(tmp_path, capsys):
    """`rnncc plan` and a call's plan (here cell.plan for a device planned by its caps) write
    plan.explain() to <cell>.plan.b<B>.<heads>x<dim>.<dtype>[.timeline].txt."""
    gru = str(ROOT / "examples" / "gru.rnn")
    with override(dump_dir=tmp_path):
        assert main(["plan", gru, "--hidden", "64", "--arch", "h100"]) == 0
        args = ["plan", gru, "--hidden", "256", "--heads", "2", "--batch", "8", "--arch", "h100"]
        assert main([*args, "--dtype", "fp16", "--timeline"]) == 0
    shown = capsys.readouterr().out
    names = sorted(p.name for p in tmp_path.iterdir() if ".plan." in p.name)
    assert names == ["gru.plan.b16.1x64.bf16.txt", "gru.plan.b8.2x128.fp16.timeline.txt"]
    assert (tmp_path / names[1]).read_text() in shown


def test_nothing_is_dumped_by_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with override(dump_dir=None):
        rnncc.load(ROOT / "examples" / "gru.rnn")
    assert list(tmp_path.iterdir()) == []


def test_a_dump_dir_that_is_a_file_is_one_clear_error(tmp_path, capsys, monkeypatch):
    file = tmp_path / "notes.txt"
    file.write_text("mine")
    message = f"RNNCC_DUMP_DIR={str(file)!r}: cannot write the stage dumps there (not a folder)"
    with override(dump_dir=file), pytest.raises(ConfigError) as info:
        rnncc.load(ROOT / "examples" / "gru.rnn")
    assert str(info.value) == message
    monkeypatch.setenv("RNNCC_DUMP_DIR", str(file))
    assert main(["check", str(ROOT / "examples" / "gru.rnn")]) == 1
    assert capsys.readouterr() == ("", f"rnncc: error: {message}\n")
    assert file.read_text() == "mine"
