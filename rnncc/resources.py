"""Where rnncc's data files live: the ``.lark`` grammar, the code-generation templates and the
built-in cells.

Input: a grammar file name. Output: an absolute :class:`~pathlib.Path` to an existing file or
folder on the real file system (lark, Jinja's ``FileSystemLoader`` and nvcc's ``-I`` all want
one).

Two layouts are supported, tried in this order:

1. an installed wheel: ``pyproject.toml`` maps the repository's top-level ``grammar/`` and
   ``templates/`` into the package, so they sit next to this file as ``rnncc/grammar`` and
   ``rnncc/templates``;
2. a source tree (the repository root on ``PYTHONPATH``, or an editable install, which
   imports ``rnncc`` from the repository): they sit next to the ``rnncc/`` folder, beside
   ``pyproject.toml`` (the check that keeps an unrelated ``site-packages/grammar`` out).

The built-in cells (``rnncc/cells/*.rnn``, the cells of ``torch.nn.LSTM``, ``GRU`` and ``RNN``)
live inside the package folder itself, so both layouts find them beside this file.

Use these functions rather than ``importlib.resources.files("rnncc.grammar")``: an editable
install maps ``rnncc`` to the checkout's ``rnncc/`` folder, where no ``grammar`` subpackage
exists, so that import fails there (checked with setuptools 84).

Invariants: nothing is read or cached at import time; every function either returns a path
that exists or raises :class:`FileNotFoundError` naming every place it looked.

Non-goals: running from a zip archive (the templates are handed to a compiler as real files),
and user-supplied template or grammar folders.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["builtin_cell_path", "builtin_cells", "grammar_dir", "grammar_path", "templates_dir"]


def _find_dir(folder: str) -> Path:
    package = Path(__file__).resolve().parent
    installed = package / folder
    source = package.parent / folder
    candidates = (installed, source)
    if installed.is_dir():
        return installed
    # Beside an installed package is site-packages, where an unrelated top-level "grammar" or
    # "templates" may live: only a folder of the checkout (which has our pyproject.toml) counts.
    if source.is_dir() and (package.parent / "pyproject.toml").is_file():
        return source
    looked = ", ".join(str(c) for c in candidates)
    raise FileNotFoundError(
        f"rnncc: the {folder}/ folder is missing (looked in: {looked}); "
        "the installation is incomplete: reinstall rnncc, or run from a full source checkout"
    )


def grammar_dir() -> Path:
    """The folder holding the ``.lark`` grammar files."""
    return _find_dir("grammar")


def grammar_path(name: str = "rnncc.lark") -> Path:
    """The path of the grammar file ``name`` (a bare file name, e.g. ``"rnncc.lark"``)."""
    if not name or Path(name).name != name:
        raise ValueError(f"rnncc: grammar name must be a bare file name, got {name!r}")
    path = grammar_dir() / name
    if not path.is_file():
        present = sorted(p.name for p in path.parent.glob("*.lark"))
        raise FileNotFoundError(
            f"rnncc: grammar file {name!r} not found in {path.parent} "
            f"(it has: {', '.join(present) or 'no .lark files'})"
        )
    return path


def templates_dir() -> Path:
    """The folder holding the Jinja templates and hand-written CUDA/C++ skeletons."""
    return _find_dir("templates")


def builtin_cells() -> tuple[str, ...]:
    """The names of the built-in cells, sorted."""
    return tuple(sorted(p.stem for p in (Path(__file__).resolve().parent / "cells").glob("*.rnn")))


def builtin_cell_path(name: str) -> Path:
    """The ``.rnn`` file of the built-in cell ``name`` (e.g. ``"lstm"``)."""
    path = Path(__file__).resolve().parent / "cells" / f"{name}.rnn"
    if not name.isidentifier() or not path.is_file():
        raise ValueError(
            f"rnncc: no built-in cell {name!r}; the built-in cells are "
            f"{', '.join(builtin_cells()) or 'missing (reinstall rnncc)'}"
        )
    return path
