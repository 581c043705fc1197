"""The ``rnncc plan`` subcommand, with a stand-in loader and IR (no front end needed)."""

from __future__ import annotations

import argparse
import json
import sys
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

import rnncc
from rnncc.tiling import command

LSTM_COUNTS = {"gate": 4, "sigmoid": 3, "state": 1, "mul": 3, "tanh": 2, "add": 1}


@pytest.fixture
def parser(monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    """A parser with ``plan`` registered, ``rnncc.load`` and ``rnncc.ir`` stood in for."""
    cell = SimpleNamespace(
        gr_names=("i", "f", "z", "o"),
        states=(SimpleNamespace(name="h"), SimpleNamespace(name="c")),
    )
    loaded: list[tuple[str, str | None]] = []

    def load(path: str, cell_name: str | None = None, **kw: Any) -> Any:
        loaded.append((path, kw.get("cell", cell_name)))
        return SimpleNamespace(ir=cell)

    fake_ir = ModuleType("rnncc.ir")
    fake_ir.op_counts = lambda c: dict(LSTM_COUNTS)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "rnncc.ir", fake_ir)
    # Through the module's dict: getattr would run rnncc's lazy import of the real loader.
    monkeypatch.setitem(vars(rnncc), "load", load)
    top = argparse.ArgumentParser(prog="rnncc")
    command.register(top.add_subparsers(dest="command"))
    top.set_defaults(loaded=loaded)
    return top


def _run(parser: argparse.ArgumentParser, argv: list[str]) -> int:
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_plan_prints_the_explanation(
    parser: argparse.ArgumentParser, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["plan", "lstm.rnn", "--hidden", "768", "--heads", "12", "--batch", "16"]
    assert _run(parser, argv + ["--dtype", "bf16", "--arch", "sm_90"]) == 0
    out = capsys.readouterr().out
    assert "Gr=4, NH=12, D=64, B=16, bf16 on NVIDIA H100 SXM" in out
    assert "tier        block" in out
    assert parser.get_default("loaded") == [("lstm.rnn", None)]


def test_plan_passes_the_cell_name_and_prints_json(
    parser: argparse.ArgumentParser, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["plan", "cells.rnn", "--cell", "lstm", "--hidden", "1024", "--arch", "h100", "--json"]
    assert _run(parser, argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["tier"] == "grid" and data["problem"]["heads"] == 1
    assert parser.get_default("loaded") == [("cells.rnn", "lstm")]


def test_plan_defaults(parser: argparse.ArgumentParser) -> None:
    args = parser.parse_args(["plan", "x.rnn", "--hidden", "64"])
    assert (args.heads, args.batch, args.dtype, args.arch, args.cell) == (1, 16, "bf16", None, None)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--hidden", "8192", "--arch", "sm_90"], "r_fits_on_chip"),
        (["--hidden", "768", "--heads", "5", "--arch", "sm_90"], "not a positive multiple"),
        (["--hidden", "768", "--arch", "sm_70"], "unknown GPU or arch"),
    ],
)
def test_plan_errors_go_to_stderr(
    parser: argparse.ArgumentParser,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    assert _run(parser, ["plan", "lstm.rnn", *argv]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("rnncc plan: error: ") and message in captured.err


def test_plan_without_arch_or_gpu_asks_for_arch(
    parser: argparse.ArgumentParser,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _run(parser, ["plan", "lstm.rnn", "--hidden", "768"]) == 1
    assert "--arch" in capsys.readouterr().err
