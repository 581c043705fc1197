"""The front end: ``.rnn`` source text → checked cell IR.

``parse`` (grammar, postlexer, transformer → AST) then ``lower`` (checks, in-order semantics,
folding and CSE → ``rnncc.ir.Cell``). Errors come as one ``DslError`` per file holding every
diagnostic; warnings are returned beside the cells.
"""

from __future__ import annotations

from pathlib import Path

from rnncc.config import get_dump_dir
from rnncc.dump import dump
from rnncc.errors import CellSelectionError, Diagnostic, Source, SourceReadError
from rnncc.frontend.ast import format_cell
from rnncc.frontend.lower import lower
from rnncc.frontend.parse import parse
from rnncc.ir.cell import Cell

__all__ = ["compile_file", "compile_source", "read_source", "select_cell"]


def compile_source(text: str, path: str = "<string>") -> tuple[list[Cell], list[Diagnostic]]:
    """Every cell of ``text`` and the warnings; raises ``DslError`` on any error. A leading
    byte-order mark is dropped, as ``read_source`` drops a file's (``rnncc.loads`` of a
    file's bytes decoded as UTF-8 compiles as ``load``)."""
    source = Source(text.removeprefix("\ufeff"), path)
    module = parse(source)
    cells, diagnostics = lower(module, source)
    if get_dump_dir() is not None:
        from rnncc.ir.printer import print_cell

        for cell_def, cell in zip(module.cells, cells, strict=True):
            dump(cell.name, "ast.txt", format_cell(cell_def))
            dump(cell.name, "ir.rnn", print_cell(cell))
    return cells, diagnostics


def read_source(path: str | Path) -> str:
    """The text of a ``.rnn`` file (UTF-8, a leading byte-order mark dropped, as editors on
    Windows write one; ``\\r\\n`` and ``\\r`` read as ``\\n``). Raises ``SourceReadError``
    (``path: cannot read: reason``) when it cannot be read; the CLI and ``rnncc.load`` both
    read through here, so they say the same."""
    if str(path) == "":  # Path("") is the current folder: "Is a directory" would puzzle
        raise SourceReadError("''", "the path is empty")
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except OSError as err:
        raise SourceReadError(str(path), err.strerror or str(err)) from None
    except UnicodeDecodeError as err:
        reason = f"not UTF-8 text ({err.reason} at byte {err.start})"
        raise SourceReadError(str(path), reason) from None
    except ValueError as err:  # a path with a NUL character
        raise SourceReadError(str(path), str(err)) from None


def compile_file(path: str | Path) -> tuple[list[Cell], list[Diagnostic]]:
    """``compile_source`` of a file's contents, reported under the path as given."""
    return compile_source(read_source(path), str(path))


def select_cell(cells: list[Cell], name: str | None, where: str, *, how: str) -> Cell:
    """The cell called ``name`` (or the only one); ``how`` tells the user how to choose, e.g.
    ``--cell NAME``. Raises ``CellSelectionError`` listing the cells otherwise."""
    names = ", ".join(c.name for c in cells)
    if name is None:
        if len(cells) == 1:
            return cells[0]
        raise CellSelectionError(f"{where} defines several cells ({names}); choose one with {how}")
    for c in cells:
        if c.name == name:
            return c
    raise CellSelectionError(f"{where} has no cell named '{name}'; it defines: {names}")
