"""The front end: ``.rnn`` source text → checked cell IR.

``parse`` (grammar, postlexer, transformer → AST) then ``lower`` (checks, in-order semantics,
folding and CSE → ``rnncc.ir.Cell``). Errors come as one ``DslError`` per file holding every
diagnostic; warnings are returned beside the cells.
"""

from __future__ import annotations

from pathlib import Path

from rnncc.errors import Diagnostic, Source
from rnncc.frontend.lower import lower
from rnncc.frontend.parse import parse
from rnncc.ir.cell import Cell

__all__ = ["compile_file", "compile_source"]


def compile_source(text: str, path: str = "<string>") -> tuple[list[Cell], list[Diagnostic]]:
    """Every cell of ``text`` and the warnings; raises ``DslError`` on any error."""
    source = Source(text, path)
    return lower(parse(source), source)


def compile_file(path: str | Path) -> tuple[list[Cell], list[Diagnostic]]:
    """``compile_source`` of a file's contents, reported under the path as given."""
    return compile_source(Path(path).read_text(encoding="utf-8"), str(path))
