"""Reading ``.rnn`` files: ``rnncc.load``, ``compile_file`` and the CLI read through one
function, and say the same when a file cannot be read: ``SourceReadError``, a ``DslError``
whose message is ``path: cannot read: reason`` (the CLI prints it after ``rnncc: error:``)."""

from __future__ import annotations

from pathlib import Path

import pytest

import rnncc
from rnncc.cli import main
from rnncc.errors import DslError, SourceReadError
from rnncc.frontend import compile_file, read_source


def _missing(tmp: Path) -> tuple[Path, str]:
    return tmp / "missing.rnn", "No such file or directory"


def _directory(tmp: Path) -> tuple[Path, str]:
    (tmp / "cells.rnn").mkdir()
    return tmp / "cells.rnn", "Is a directory"


def _not_utf8(tmp: Path) -> tuple[Path, str]:
    (tmp / "latin1.rnn").write_bytes("cell f(h) {\n    h = h # é\n}\n".encode("latin-1"))
    return tmp / "latin1.rnn", "not UTF-8 text (invalid continuation byte at byte 24)"


def _nul_in_path(tmp: Path) -> tuple[Path, str]:
    return tmp / "a\0b.rnn", "embedded null byte"


UNREADABLE = [_missing, _directory, _not_utf8, _nul_in_path]


@pytest.mark.parametrize("make", UNREADABLE, ids=lambda f: f.__name__.strip("_"))
def test_load_says_what_the_cli_says(make, tmp_path, capsys):
    path, reason = make(tmp_path)
    message = f"{path}: cannot read: {reason}"
    for read in (rnncc.load, compile_file, read_source):
        with pytest.raises(SourceReadError) as info:
            read(path)
        assert str(info.value) == message
        assert isinstance(info.value, DslError)
        assert info.value.path == str(path)
        assert info.value.diagnostics[0].render() == f"{path}: error: cannot read: {reason}"
    assert main(["check", str(path)]) == 1
    assert capsys.readouterr() == ("", f"rnncc: error: {message}\n")


def test_load_reads_crlf_files_as_the_cli_does(tmp_path, capsys):
    path = tmp_path / "crlf.rnn"
    path.write_bytes(b"cell f(h) {\r\n    h = tanh(h)\r\n}\r\n")
    assert rnncc.load(path).name == "f"
    assert main(["check", str(path)]) == 0
    assert capsys.readouterr().out == f"{path}: ok (1 cell: f)\n"


def test_an_empty_path_says_so(capsys):
    message = "'': cannot read: the path is empty"  # not the current folder's "Is a directory"
    for read in (rnncc.load, compile_file, read_source):
        with pytest.raises(SourceReadError, match=f"^{message}$"):
            read("")
    assert main(["check", ""]) == 1
    assert capsys.readouterr() == ("", f"rnncc: error: {message}\n")


def test_a_byte_order_mark_is_dropped(tmp_path, capsys):
    """Editors on Windows start UTF-8 files with U+FEFF; it is not part of the cell."""
    path, plain = tmp_path / "bom.rnn", tmp_path / "plain.rnn"
    wrong = b"cell 1f(h) {\n    h = tanh(h)\n}\n"  # an error on the mark's line
    path.write_bytes(b"\xef\xbb\xbf" + wrong)
    plain.write_bytes(wrong)
    assert main(["check", str(path)]) == main(["check", str(plain)]) == 1
    with_mark, without = capsys.readouterr().err.split(f"{plain}:")
    assert with_mark.startswith(f"{path}:1:6: error:") and with_mark == f"{path}:" + without
    path.write_bytes(b"\xef\xbb\xbfcell f(h) {\n    h = tanh(h)\n}\n")
    assert rnncc.load(path).name == "f"


def test_load_of_a_file_with_a_long_sum(tmp_path):
    path = tmp_path / "long.rnn"
    path.write_text("cell f(h) {\n    h = " + " + ".join(["h"] * 3000) + "\n}\n")
    assert rnncc.load(path).state_names == ("h",)
