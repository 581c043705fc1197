"""rnncc: a compiler for recurrent neural network cells.

Write a cell's gates and state updates in a ``.rnn`` file, then ``rnncc.load`` it and call
it like a function of tensors, or wrap it in ``rnncc.RNN``::

    cell = rnncc.load("examples/lstm.rnn")  # or rnncc.load_builtin("lstm")
    y, last = cell(Wx, R, b)

Nothing is parsed, built or configured at import time: the public names below are imported
on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "RNN",
    "BuildError",
    "CompiledCell",
    "DslError",
    "DslSyntaxError",
    "RnnccError",
    "RnnccWarning",
    "TilingError",
    "load",
    "load_builtin",
    "loads",
]

_LAZY = {
    "load": "rnncc.runtime.api",
    "loads": "rnncc.runtime.api",
    "load_builtin": "rnncc.runtime.api",
    "CompiledCell": "rnncc.runtime.api",
    "RnnccWarning": "rnncc.runtime.api",
    "RNN": "rnncc.runtime.module",
    "RnnccError": "rnncc.errors",
    "DslError": "rnncc.errors",
    "DslSyntaxError": "rnncc.errors",
    "TilingError": "rnncc.errors",
    "BuildError": "rnncc.errors",
}

if TYPE_CHECKING:
    from rnncc.errors import BuildError, DslError, DslSyntaxError, RnnccError, TilingError
    from rnncc.runtime.api import CompiledCell, RnnccWarning, load, load_builtin, loads
    from rnncc.runtime.module import RNN


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rnncc' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
