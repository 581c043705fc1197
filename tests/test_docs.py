"""The language reference stays true: every complete cell in docs/language.md compiles
without warnings, and every error example prints exactly the diagnostics the doc shows."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from rnncc.cli import main
from rnncc.frontend import compile_source

DOC = Path(__file__).resolve().parents[1] / "docs" / "language.md"
BLOCKS = re.findall(r"```(rnn(?: error)?|text)\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)


def _cells() -> list[str]:
    return [body for kind, body in BLOCKS if kind == "rnn" and re.search(r"^cell ", body, re.M)]


def _error_examples() -> list[tuple[str, str]]:
    pairs = []
    for (kind, body), (next_kind, shown) in itertools.pairwise(BLOCKS):
        if kind == "rnn error" and next_kind == "text":
            pairs.append((body, shown))
    return pairs


def test_the_doc_has_examples():
    assert len(_cells()) >= 10 and len(_error_examples()) == 2


@pytest.mark.parametrize("body", _cells(), ids=lambda b: b.split("(")[0].split()[-1])
def test_doc_cells_compile_without_warnings(body):
    cells, warnings = compile_source(body, "doc.rnn")
    assert cells and not warnings, [w.render() for w in warnings]


@pytest.mark.parametrize("body,shown", _error_examples(), ids=["semantic", "syntax"])
def test_doc_error_output_is_what_the_tool_prints(body, shown, tmp_path, capsys, monkeypatch):
    name = re.match(r"(\S+\.rnn):", shown).group(1)
    (tmp_path / name).write_text(body)
    monkeypatch.chdir(tmp_path)
    assert main(["check", name]) == 1
    assert capsys.readouterr().err == shown


API_DOC = DOC.with_name("api.md")


def test_api_doc_example_runs():
    """The first code block of docs/api.md runs as written (on the CPU: the reference)."""
    (first, *_) = re.findall(r"```python\n(.*?)```", API_DOC.read_text(encoding="utf-8"), re.S)
    exec(compile(first, str(API_DOC), "exec"), {})


def test_api_doc_names_every_public_name():
    """docs/api.md is the whole Python API: every public name of rnncc, of a CompiledCell and
    of rnncc.RNN, and every environment variable rnncc reads, appears in it."""
    import rnncc
    from rnncc.config import __doc__ as config_doc
    from rnncc.runtime.api import CompiledCell
    from rnncc.runtime.module import RNN

    text = API_DOC.read_text(encoding="utf-8")
    cell = rnncc.loads("cell c(h) {\n    gates a = W x + R h + b\n    h = tanh(a)\n}\n")
    members = {n for n in dir(CompiledCell) if not n.startswith("_")}
    members |= {n for n in vars(cell) if not n.startswith("_")}
    layer = {n for n in vars(RNN) if not n.startswith("_")} - {"forward", "extra_repr"}
    variables = set(re.findall(r"^(RNNCC_\w+|MAX_JOBS)\s", config_doc or "", re.M))
    assert variables
    names = set(rnncc.__all__) | members | layer | variables
    # in a code span: `name`, `rnncc.name`, `name(...)`
    missing = [n for n in sorted(names) if not re.search(rf"`[^`\n]*\b{n}\b[^`\n]*`", text)]
    assert not missing, f"not in docs/api.md: {missing}"
