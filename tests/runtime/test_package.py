"""Compiled packages: the IR as JSON (``rnncc.ir.serialize``) and ``write_package`` /
``load_package`` (``rnncc.runtime.package``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import rnncc
from rnncc.autodiff import derive_backward
from rnncc.frontend import compile_source
from rnncc.ir.printer import print_backward, print_cell
from rnncc.ir.serialize import FORMAT, dump_cells, load_cells
from rnncc.runtime import package
from rnncc.runtime.package import load_package, write_package

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.rnn"))

# Infinite initial values and constants, a param, two outputs.
SPECIAL = """cell special(h, c = 1.0, m = -inf) {
    const big = inf
    gates a = W x + R h + b
    param p = -0.5
    c = c + a
    m = max(m, a - big)
    h = tanh(c + m * p)
    output h, m
}
"""


def compile_one(path: Path):
    (cell,), _ = compile_source(path.read_text(), str(path))
    return cell


def roundtrip(cell):
    backward = derive_backward(cell)
    data = json.loads(json.dumps(dump_cells(cell, backward)))  # through JSON text
    return backward, *load_cells(data)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_roundtrip_every_example(path: Path) -> None:
    cell = compile_one(path)
    backward, cell2, backward2 = roundtrip(cell)
    assert cell2 == cell
    assert backward2 == backward
    assert backward2.forward is cell2
    # names, source and path survive too (they take no part in equality)
    assert print_cell(cell2) == print_cell(cell)
    assert print_backward(backward2) == print_backward(backward)
    assert cell2.source == cell.source and cell2.source.path == str(path)


def test_roundtrip_infinities_and_outputs() -> None:
    (cell,), _ = compile_source(SPECIAL)
    _, cell2, backward2 = roundtrip(cell)
    assert cell2 == cell
    assert [(s.name, s.init) for s in cell2.states] == [
        ("h", 0.0),
        ("c", 1.0),
        ("m", -float("inf")),
    ]
    assert [(c.name, c.value) for c in cell2.consts] == [("big", float("inf"))]
    assert cell2.outputs == ("h", "m") and cell2.param_names == ("p",)
    assert backward2 == derive_backward(cell)


def test_dump_shares_nodes() -> None:
    cell = compile_one(REPO / "examples/slstm.rnn")
    data = dump_cells(cell, derive_backward(cell))
    assert data["format"] == FORMAT
    nodes = [json.dumps(n[:3]) for n in data["nodes"]]
    assert len(nodes) == len(set(nodes))  # each node once
    for k, (_, src, _, _) in enumerate(data["nodes"]):
        assert all(i < k for i in src)  # operands before users


@pytest.mark.parametrize("fmt", ["rnncc-ir/999", None])
def test_unknown_format_is_refused(fmt: str | None) -> None:
    cell = compile_one(REPO / "examples/lstm.rnn")
    data = dump_cells(cell, derive_backward(cell))
    if fmt is None:
        del data["format"]
    else:
        data["format"] = fmt
    with pytest.raises(rnncc.RnnccError) as err:
        load_cells(data)
    assert str(err.value) == (
        f"compiled cell has format {fmt!r}; this rnncc reads 'rnncc-ir/1': "
        "recompile it with `rnncc compile`"
    )


# ---- write_package / load_package --------------------------------------------------------


def test_write_and_load_package(tmp_path: Path) -> None:
    path = REPO / "examples/peephole_lstm.rnn"
    cell = compile_one(path)
    out = write_package(cell, tmp_path / "nested" / "peephole")
    assert out == tmp_path / "nested" / "peephole"
    assert sorted(p.name for p in out.iterdir()) == [
        "__init__.py",
        "cell.json",
        "cell.rnn",
        "kernels",
    ]
    assert (out / "cell.rnn").read_text() == path.read_text()
    assert json.loads((out / "cell.json").read_text())["rnncc_version"] == rnncc.__version__
    init = (out / "__init__.py").read_text()
    assert f"compiled from {path} by rnncc {rnncc.__version__}" in init
    assert "from peephole import cell, RNN" in init

    loaded = load_package(out / "cell.json")
    assert loaded.ir == cell and loaded.backward_ir == derive_backward(cell)
    reference = rnncc.load(path)
    shapes = reference.shapes(2, 3, 2, 3)
    args = [
        torch.randn(shapes[k], dtype=torch.float64) for k in ("Wx", "R", "b", "states", "params")
    ]
    for got, want in zip(loaded(*args), reference(*args), strict=True):
        assert torch.equal(got, want)


def test_package_folder_has_the_usual_permissions(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    os.umask(umask)
    out = write_package(compile_one(REPO / "examples/gru.rnn"), tmp_path / "gru_pkg")
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask


def package_files(out: Path) -> dict[str, str]:
    return {str(p.relative_to(out)): p.read_text() for p in sorted(out.rglob("*")) if p.is_file()}


def test_write_package_replaces_an_earlier_package(tmp_path: Path) -> None:
    out = write_package(compile_one(REPO / "examples/lstm.rnn"), tmp_path / "pkg")
    (out / "stale.txt").write_text("from the earlier package")
    write_package(compile_one(REPO / "examples/gru.rnn"), out)
    assert sorted(package_files(out)) == [
        "__init__.py",
        "cell.json",
        "cell.rnn",
        "kernels/gru_stepwise.cu",
        "kernels/rnncc_abi.h",
        "kernels/rnncc_mma.cuh",
        "kernels/rnncc_ops.cuh",
    ]
    assert load_package(out / "cell.json").name == "gru"
    assert [p.name for p in tmp_path.iterdir()] == ["pkg"]  # no temporary or old folders left


def test_failed_write_keeps_the_earlier_package(tmp_path: Path, monkeypatch) -> None:
    out = write_package(compile_one(REPO / "examples/lstm.rnn"), tmp_path / "pkg")
    before = package_files(out)
    monkeypatch.setattr(package, "_INIT", "{no_such_field}")  # fails after cell.json is written
    with pytest.raises(KeyError):
        write_package(compile_one(REPO / "examples/gru.rnn"), out)
    assert package_files(out) == before
    assert [p.name for p in tmp_path.iterdir()] == ["pkg"]


def test_failed_move_puts_the_earlier_package_back(tmp_path: Path, monkeypatch) -> None:
    out = write_package(compile_one(REPO / "examples/lstm.rnn"), tmp_path / "pkg")
    before = package_files(out)
    real_replace = os.replace

    def replace(src, dst):
        if Path(src).name.startswith(".pkg.") and Path(src).name != ".pkg.old" and Path(dst) == out:
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(package.os, "replace", replace)
    with pytest.raises(OSError):
        write_package(compile_one(REPO / "examples/gru.rnn"), out)
    monkeypatch.undo()
    assert package_files(out) == before
    assert [p.name for p in tmp_path.iterdir()] == ["pkg"]


def test_write_package_never_replaces_other_folders(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(rnncc.RnnccError) as err:
        write_package(compile_one(REPO / "examples/lstm.rnn"), mine)
    assert str(err.value) == (
        f"{mine} exists and is not an rnncc package: not replacing it; "
        "remove it or choose another output folder"
    )
    assert package_files(mine) == {"notes.txt": "keep me"}


@pytest.mark.parametrize("name", ["my-pkg", "1st", "class", "."])
def test_write_package_needs_an_identifier(tmp_path: Path, monkeypatch, name: str) -> None:
    monkeypatch.chdir(tmp_path)
    out = Path(name)
    with pytest.raises(rnncc.RnnccError) as err:
        write_package(compile_one(REPO / "examples/lstm.rnn"), out)
    assert str(err.value) == (
        f"{out}: a package folder needs a Python identifier as its name (its import name), "
        f"not {out.name!r}"
    )
    assert list(tmp_path.iterdir()) == []


def test_load_package_refuses_an_unknown_format(tmp_path: Path) -> None:
    out = write_package(compile_one(REPO / "examples/lstm.rnn"), tmp_path / "pkg")
    data = json.loads((out / "cell.json").read_text())
    data["format"] = "rnncc-ir/0"
    (out / "cell.json").write_text(json.dumps(data))
    with pytest.raises(rnncc.RnnccError, match="compiled cell has format 'rnncc-ir/0'"):
        load_package(out / "cell.json")
