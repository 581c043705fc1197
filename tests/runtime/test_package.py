"""Compiled packages: the IR as JSON (``rnncc.ir.serialize``) and ``write_package`` /
``load_package`` (``rnncc.runtime.package``)."""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

import pytest
import torch

import rnncc
from rnncc.autodiff import derive_backward
from rnncc.cli import main
from rnncc.frontend import compile_source
from rnncc.ir.printer import print_backward, print_cell
from rnncc.ir.serialize import FORMAT, dump_cells, load_cells
from rnncc.runtime import package
from rnncc.runtime.package import MANIFEST, load_package, write_package

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
        ".rnncc-package.json",
        "__init__.py",
        "cell.json",
        "cell.rnn",
        "kernels",
    ]
    assert (out / "cell.rnn").read_text() == path.read_text()
    assert json.loads((out / "cell.json").read_text())["rnncc_version"] == rnncc.__version__
    init = (out / "__init__.py").read_text()
    assert f"A cell compiled by rnncc {rnncc.__version__}" in init
    assert f"\nSOURCE_PATH = {str(path)!r}\n" in init
    assert "\nCELL_NAME = 'peephole_lstm'\n" in init
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


def test_manifest_lists_every_file_rnncc_wrote(tmp_path: Path) -> None:
    out = write_package(compile_one(REPO / "examples/gru.rnn"), tmp_path / "pkg", plan=PLAN)
    assert json.loads((out / MANIFEST).read_text()) == {
        "format": "rnncc-package/1",
        "rnncc_version": rnncc.__version__,
        "cell": "gru",
        "files": GRU_FILES + ["plan.json", "plan.txt"],
    }
    assert sorted(package_files(out)) == sorted([MANIFEST, *GRU_FILES, "plan.json", "plan.txt"])


def test_package_folder_has_the_usual_permissions(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    os.umask(umask)
    out = write_package(compile_one(REPO / "examples/gru.rnn"), tmp_path / "gru_pkg")
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask
    assert (out / "cell.json").stat().st_mode & 0o777 == 0o666 & ~umask


def package_files(out: Path) -> dict[str, str]:
    return {str(p.relative_to(out)): p.read_text() for p in sorted(out.rglob("*")) if p.is_file()}


GRU_FILES = [
    "__init__.py",
    "cell.json",
    "cell.rnn",
    "kernels/decode.cuh",
    "kernels/gru_stepwise.cu",
    "kernels/rnncc_abi.h",
    "kernels/rnncc_mma.cuh",
    "kernels/rnncc_ops.cuh",
    "kernels/stepwise.cuh",
    "kernels/timeline.cuh",
]
PLAN = {"plan.txt": "a plan\n", "plan.json": "{}\n"}


def listed(out: Path) -> list[str]:
    return json.loads((out / MANIFEST).read_text())["files"]


def test_recompile_replaces_the_package_and_keeps_the_users_files(tmp_path: Path) -> None:
    out = write_package(compile_one(REPO / "examples/lstm.rnn"), tmp_path / "pkg", plan=PLAN)
    (out / "notes.txt").write_text("mine")
    (out / "kernels" / "mine.cu").write_text("// mine")
    (out / "cell.rnn").write_text("edited by hand")  # rnncc's file: overwritten
    write_package(compile_one(REPO / "examples/gru.rnn"), out)
    files = package_files(out)
    assert sorted(files) == sorted([MANIFEST, *GRU_FILES, "kernels/mine.cu", "notes.txt"])
    assert files["notes.txt"] == "mine" and files["kernels/mine.cu"] == "// mine"
    assert files["cell.rnn"] == (REPO / "examples/gru.rnn").read_text()
    assert listed(out) == GRU_FILES  # the plan files and lstm_stepwise.cu are gone
    assert load_package(out / "cell.json").name == "gru"
    assert [p.name for p in tmp_path.iterdir()] == ["pkg"]  # no temporary or old folders left


def test_recompile_removes_folders_only_its_files_were_in(tmp_path: Path) -> None:
    out = write_package(compile_one(REPO / "examples/lstm.rnn"), tmp_path / "pkg")
    (out / "old" / "deep").mkdir(parents=True)
    (out / "old" / "deep" / "gone.txt").write_text("rnncc's")
    (out / "kept").mkdir()
    (out / "kept" / "gone.txt").write_text("rnncc's")
    (out / "kept" / "mine.txt").write_text("mine")
    manifest = json.loads((out / MANIFEST).read_text())
    manifest["files"] += ["old/deep/gone.txt", "kept/gone.txt", "never/written.txt"]
    (out / MANIFEST).write_text(json.dumps(manifest))
    write_package(compile_one(REPO / "examples/gru.rnn"), out)
    assert sorted(package_files(out)) == sorted([MANIFEST, *GRU_FILES, "kept/mine.txt"])
    assert not (out / "old").exists()


def test_sibling_old_folder_is_left_alone(tmp_path: Path) -> None:
    out = write_package(compile_one(REPO / "examples/lstm.rnn"), tmp_path / "pkg")
    old = tmp_path / ".pkg.old"
    old.mkdir()
    (old / "precious.txt").write_text("keep me")
    write_package(compile_one(REPO / "examples/gru.rnn"), out)
    assert package_files(old) == {"precious.txt": "keep me"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [".pkg.old", "pkg"]


def test_failed_generation_writes_nothing(tmp_path: Path, monkeypatch) -> None:
    out = write_package(compile_one(REPO / "examples/lstm.rnn"), tmp_path / "pkg")
    before = package_files(out)
    monkeypatch.setattr(package, "_INIT", "{no_such_field}")  # fails after cell.json is made
    with pytest.raises(KeyError):
        write_package(compile_one(REPO / "examples/gru.rnn"), out)
    assert package_files(out) == before
    assert [p.name for p in tmp_path.iterdir()] == ["pkg"]


def test_interrupted_write_leaves_a_loadable_package_that_a_rerun_finishes(
    tmp_path: Path, monkeypatch
) -> None:
    """A failure while replacing cell.json: the earlier cell.json and __init__.py stay, no
    temporary file is left, and the manifest lists every file rnncc wrote, old and new."""
    out = write_package(compile_one(REPO / "examples/lstm.rnn"), tmp_path / "pkg")
    real_replace = os.replace

    def replace(src, dst):
        if Path(dst) == out / "cell.json":
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(package.os, "replace", replace)
    with pytest.raises(OSError):
        write_package(compile_one(REPO / "examples/gru.rnn"), out)
    monkeypatch.undo()
    assert load_package(out / "cell.json").name == "lstm"
    assert "kernels/lstm_stepwise.cu" in listed(out) and "kernels/gru_stepwise.cu" in listed(out)
    assert not [p for p in out.rglob("*.tmp")]
    write_package(compile_one(REPO / "examples/gru.rnn"), out)
    assert sorted(package_files(out)) == sorted([MANIFEST, *GRU_FILES])
    assert load_package(out / "cell.json").name == "gru"


NOT_A_PACKAGE = (
    "{out} exists and is not an rnncc package (no .rnncc-package.json): not writing into it; "
    "choose another folder or remove it"
)


@pytest.mark.parametrize("files", [["notes.txt"], ["cell.json", "notes.txt"], [".hidden"]])
def test_write_package_never_writes_into_other_folders(tmp_path: Path, files: list[str]) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    for name in files:
        (mine / name).write_text(f"my {name}")
    with pytest.raises(rnncc.RnnccError) as err:
        write_package(compile_one(REPO / "examples/lstm.rnn"), mine)
    assert str(err.value) == NOT_A_PACKAGE.format(out=mine)
    assert package_files(mine) == {name: f"my {name}" for name in files}
    assert [p.name for p in tmp_path.iterdir()] == ["mine"]


def test_write_package_fills_an_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    out = write_package(compile_one(REPO / "examples/gru.rnn"), tmp_path / "pkg")
    assert sorted(package_files(out)) == sorted([MANIFEST, *GRU_FILES])


@pytest.mark.parametrize(
    "rel", ["../victim", "/abs/victim", "kernels/../../victim", "..\\victim", "", ".", 7]
)
def test_manifest_cannot_reach_outside_the_folder(tmp_path: Path, rel: object) -> None:
    out = write_package(compile_one(REPO / "examples/lstm.rnn"), tmp_path / "pkg")
    (tmp_path / "victim").write_text("keep me")
    manifest = json.loads((out / MANIFEST).read_text())
    manifest["files"].append(rel)
    (out / MANIFEST).write_text(json.dumps(manifest))
    before = package_files(out)
    with pytest.raises(rnncc.RnnccError) as err:
        write_package(compile_one(REPO / "examples/gru.rnn"), out)
    assert str(err.value) == (
        f"{out / MANIFEST} lists {rel!r}, which is not a file inside {out}: not writing into "
        f"{out}; choose another folder or remove it"
    )
    assert (tmp_path / "victim").read_text() == "keep me"
    assert package_files(out) == before


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{", "(Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"),
        ('{"format": "rnncc-package/9", "files": []}', "format 'rnncc-package/9'"),
        ('{"format": "rnncc-package/1"}', "format 'rnncc-package/1'"),
        ("[]", "format None"),
    ],
)
def test_unreadable_manifest_is_refused(tmp_path: Path, text: str, why: str) -> None:
    out = write_package(compile_one(REPO / "examples/lstm.rnn"), tmp_path / "pkg")
    (out / MANIFEST).write_text(text)
    before = package_files(out)
    with pytest.raises(rnncc.RnnccError) as err:
        write_package(compile_one(REPO / "examples/gru.rnn"), out)
    refuse = f"not writing into {out}; choose another folder or remove it"
    if text == "{":
        want = f"{out / MANIFEST}: cannot read the package manifest {why}: {refuse}"
    else:
        want = (
            f"{out / MANIFEST}: not a package manifest this rnncc reads ({why}; this rnncc "
            f"writes 'rnncc-package/1'): {refuse}"
        )
    assert str(err.value) == want
    assert package_files(out) == before


def test_listed_file_that_became_a_folder_is_not_replaced(tmp_path: Path) -> None:
    out = write_package(compile_one(REPO / "examples/lstm.rnn"), tmp_path / "pkg")
    (out / "cell.rnn").unlink()
    (out / "cell.rnn").mkdir()
    (out / "cell.rnn" / "mine.txt").write_text("mine")
    before = package_files(out)
    with pytest.raises(rnncc.RnnccError) as err:
        write_package(compile_one(REPO / "examples/gru.rnn"), out)
    assert str(err.value) == (
        f"{out / 'cell.rnn'} is listed in .rnncc-package.json as a file rnncc wrote but is now "
        "a folder: not replacing it; move it away or choose another folder"
    )
    assert package_files(out) == before


def test_users_file_where_the_package_needs_one_is_not_replaced(tmp_path: Path) -> None:
    out = write_package(compile_one(REPO / "examples/lstm.rnn"), tmp_path / "pkg")
    (out / "plan.txt").write_text("my plan")
    before = package_files(out)
    with pytest.raises(rnncc.RnnccError) as err:
        write_package(compile_one(REPO / "examples/lstm.rnn"), out, plan=PLAN)
    assert str(err.value) == (
        f"{out / 'plan.txt'} exists and rnncc did not write it (it is not listed in "
        ".rnncc-package.json): not replacing it; move it away or choose another folder"
    )
    assert package_files(out) == before


def test_symlinked_kernels_folder_is_not_followed(tmp_path: Path) -> None:
    """Deleting kernels/lstm_stepwise.cu through a link would delete outside the package."""
    out = write_package(compile_one(REPO / "examples/lstm.rnn"), tmp_path / "pkg")
    elsewhere = tmp_path / "elsewhere"
    (out / "kernels").rename(elsewhere)
    (out / "kernels").symlink_to(elsewhere)
    before = package_files(elsewhere)
    with pytest.raises(rnncc.RnnccError) as err:
        write_package(compile_one(REPO / "examples/gru.rnn"), out)
    assert str(err.value) == (
        f"{out / 'kernels'} is a symbolic link, where rnncc keeps package files: not writing "
        f"into {out}; move it away or choose another folder"
    )
    assert package_files(elsewhere) == before
    assert load_package(out / "cell.json").name == "lstm"


def test_output_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "pkg").write_text("mine")
    with pytest.raises(rnncc.RnnccError) as err:
        write_package(compile_one(REPO / "examples/lstm.rnn"), tmp_path / "pkg")
    assert str(err.value) == (
        f"{tmp_path / 'pkg'} exists and is not a folder: not writing a package there; "
        "choose another folder or remove it"
    )
    assert (tmp_path / "pkg").read_text() == "mine"


@pytest.mark.parametrize("name", ["my-pkg", "1st", "class", "my-dir/."])
def test_write_package_needs_an_identifier(tmp_path: Path, monkeypatch, name: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my-dir").mkdir()
    out = Path(name)
    with pytest.raises(rnncc.RnnccError) as err:
        write_package(compile_one(REPO / "examples/lstm.rnn"), out)
    assert str(err.value) == (
        f"{out}: a package folder needs a Python identifier as its name (its import name), "
        f"not {Path(os.path.abspath(out)).name!r}"
    )
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["my-dir"]


@pytest.mark.parametrize(
    ("name", "owner"),
    [
        ("rnncc", "rnncc or a module it needs"),
        ("torch", "rnncc or a module it needs"),
        ("typing", "a standard library module"),
        ("json", "a standard library module"),
    ],
)
def test_write_package_refuses_the_name_of_a_module_it_would_meet(
    tmp_path: Path, name: str, owner: str
) -> None:
    """``-o out/rnncc`` imported itself half-initialised, ``-o out/typing`` got the standard
    library's module."""
    out = tmp_path / name
    with pytest.raises(rnncc.RnnccError) as err:
        write_package(compile_one(REPO / "examples/lstm.rnn"), out)
    assert str(err.value) == (
        f"{out}: {name!r} is the name of {owner}, which a package so named would shadow or be "
        "shadowed by when imported; name the folder something else"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_package_imports_from_a_zip_file(tmp_path: Path, monkeypatch) -> None:
    """cell.json is read as a resource of the package, not a path next to __init__.py."""
    import zipfile

    out = tmp_path / "zipped_lstm_cell"
    write_package(compile_one(REPO / "examples/lstm.rnn"), out)
    archive = tmp_path / "cells.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for f in out.rglob("*"):
            z.write(f, f.relative_to(tmp_path).as_posix())
    monkeypatch.syspath_prepend(str(archive))
    try:
        module = importlib.import_module("zipped_lstm_cell")
        assert module.__file__.startswith(str(archive)) and module.cell.name == "lstm"
    finally:
        sys.modules.pop("zipped_lstm_cell", None)


def test_write_package_refuses_a_name_import_would_change(tmp_path: Path) -> None:
    """Python normalises identifiers (NFKC): ``import ﬁle`` (a ligature) looks for ``file``."""
    out = tmp_path / "\ufb01le"
    with pytest.raises(rnncc.RnnccError) as err:
        write_package(compile_one(REPO / "examples/lstm.rnn"), out)
    assert str(err.value) == (
        f"{out}: Python imports the name '\ufb01le' as 'file', so it would not find this "
        "folder; name it that way"
    )
    assert list(tmp_path.iterdir()) == []


def test_write_package_into_the_current_folder(tmp_path: Path, monkeypatch) -> None:
    """``-o .`` names the package after the folder it is run in, as ``-o ../mypkg`` does."""
    folder = tmp_path / "rnncc_here_pkg"
    folder.mkdir()
    monkeypatch.chdir(folder)
    assert main(["compile", str(REPO / "examples/gru.rnn"), "-o", "."]) == 0
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert importlib.import_module(folder.name).cell.name == "gru"
    finally:
        sys.modules.pop(folder.name, None)


def test_load_package_refuses_an_unknown_format(tmp_path: Path) -> None:
    out = write_package(compile_one(REPO / "examples/lstm.rnn"), tmp_path / "pkg")
    data = json.loads((out / "cell.json").read_text())
    data["format"] = "rnncc-ir/0"
    (out / "cell.json").write_text(json.dumps(data))
    with pytest.raises(rnncc.RnnccError, match="compiled cell has format 'rnncc-ir/0'"):
        load_package(out / "cell.json")


# ---- hostile paths -----------------------------------------------------------------------

ELMAN = "cell elman(h) {\n  gates a = W x + R h + b\n  h = tanh(a)\n}\n"


def import_package(out: Path):
    """Import the package at ``out`` under its folder's name, then forget it again."""
    sys.path.insert(0, str(out.parent))
    try:
        return importlib.import_module(out.name)
    finally:
        sys.path.remove(str(out.parent))
        sys.modules.pop(out.name, None)


def test_file_name_with_python_in_it_does_not_run(tmp_path: Path, monkeypatch) -> None:
    """``\"\"\"`` in the path ended the old docstring; what followed ran on import."""
    monkeypatch.chdir(tmp_path)
    name = 'x"""; open("pwned", "w"); """#\nstatic int rnncc_payload = 1;\n.rnn'
    (tmp_path / name).write_text(ELMAN)
    assert main(["compile", str(tmp_path / name), "-o", str(tmp_path / "hostile_pkg")]) == 0
    pkg = import_package(tmp_path / "hostile_pkg")
    assert not (tmp_path / "pwned").exists()
    assert str(tmp_path / name) == pkg.SOURCE_PATH and pkg.cell.name == "elman"
    cu = (tmp_path / "hostile_pkg" / "kernels" / "elman_stepwise.cu").read_text()
    head = cu[: cu.index('\n#include "')].splitlines()
    assert all(line.startswith("//") for line in head), head[:3]


@pytest.mark.parametrize(
    "path",
    ["C:\\Users\\new\\cell.rnn", "\\\\server\\x\\N{}\\u.rnn", "a\u2028b\rc.rnn", "bytes\udcff.rnn"],
)
def test_windows_and_odd_paths_import(tmp_path: Path, path: str) -> None:
    """A backslash path once made the package a SyntaxError (``\\U`` escape)."""
    cell = rnncc.loads(ELMAN, path=path)
    pkg = import_package(write_package(cell.ir, tmp_path / "winpkg"))
    assert path == pkg.SOURCE_PATH and pkg.CELL_NAME == "elman"
    assert pkg.cell.ir == cell.ir and pkg.cell.ir.source.path == path


def test_docs_show_the_refusal_the_tool_prints(tmp_path: Path, monkeypatch, capsys) -> None:
    doc = (REPO / "docs" / "compile.md").read_text(encoding="utf-8")
    shown = next(line.strip() for line in doc.splitlines() if "not an rnncc package" in line)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "build" / "lstm_cell").mkdir(parents=True)
    (tmp_path / "build" / "lstm_cell" / "notes.txt").write_text("mine")
    assert main(["compile", str(REPO / "examples/lstm.rnn"), "-o", "build/lstm_cell"]) == 1
    assert capsys.readouterr().err == shown + "\n"


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d["states"][0].__setitem__(0, 'h] = 0; system("x"); float y[1'),
        lambda d: d["nodes"][0].__setitem__(3, "t\nstatic int x = 1;"),
        lambda d: d["nodes"][0].__setitem__(0, "system"),
    ],
    ids=["state name", "temporary name", "op"],
)
def test_a_hand_edited_cell_json_cannot_put_code_into_kernels(tmp_path: Path, edit) -> None:
    """Names from cell.json are spelled in generated CUDA: anything but an identifier (and an
    op of the table) is refused when the package loads."""
    import json

    from rnncc.runtime.package import load_package

    out = write_package(compile_one(REPO / "examples/lstm.rnn"), tmp_path / "pkg")
    data = json.loads((out / "cell.json").read_text())
    edit(data)
    (out / "cell.json").write_text(json.dumps(data))
    with pytest.raises(rnncc.RnnccError, match="recompile it with `rnncc compile`"):
        load_package(out / "cell.json")
