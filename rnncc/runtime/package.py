"""Compiled cell packages: what ``rnncc compile FILE -o DIR`` writes and how it loads.

DIR becomes an importable Python package:

- ``cell.json`` — the forward and backward IR (``rnncc.ir.serialize``), with the source;
- ``cell.rnn`` — the cell's source as written, for reading;
- ``kernels/`` — the generated CUDA of the stepwise backend and the headers it includes
  (the runtime regenerates the same bytes, so a library prebuilt from them is found in the
  cache by content);
- ``plan.txt`` / ``plan.json`` — the tiling plan, when sizes were given;
- ``__init__.py`` — loads ``cell.json`` into ``cell`` (a ``CompiledCell``) without running
  the front end or autodiff, and offers ``RNN(...)``, ``rnncc.RNN`` bound to the cell. On
  first use on a GPU the kernels are built (or loaded from the cache) for that GPU.

Files are written to a temporary folder and moved into place, so a reader never sees a
half-written package. DIR's name must be a Python identifier and not a keyword (it is the
package's import name); an existing DIR is replaced only when it holds an earlier package (a
``cell.json``), never a folder of other files; if the move fails the earlier package is put
back.
"""

from __future__ import annotations

import json
import keyword
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from rnncc import __version__
from rnncc.autodiff import derive_backward
from rnncc.codegen.stepwise import generate_stepwise
from rnncc.errors import RnnccError
from rnncc.ir.cell import Cell
from rnncc.ir.serialize import dump_cells, load_cells
from rnncc.resources import templates_dir
from rnncc.runtime.api import CompiledCell

_INIT = '''"""rnncc cell '{name}', compiled from {path} by rnncc {version}.

    from {package} import cell, RNN
    y, last = cell(Wx, R, b)          # shapes: see cell.shapes(B, T, NH, D)
    layer = RNN(input_size, hidden_size, num_heads=1)

Generated file: recompile with `rnncc compile` rather than editing it.
"""

from pathlib import Path as _Path

from rnncc.runtime.package import load_package as _load_package

cell = _load_package(_Path(__file__).with_name("cell.json"))


def RNN(*args, **kwargs):
    """``rnncc.RNN`` with this package's cell."""
    import rnncc

    return rnncc.RNN(cell, *args, **kwargs)
'''


def write_package(cell: Cell, out: Path, *, plan: Mapping[str, str] | None = None) -> Path:
    """Write ``out`` as a package of ``cell``; replaces an earlier package there. ``plan``
    maps file names (``plan.txt``, ``plan.json``) to their text."""
    out = Path(out)
    if not out.name.isidentifier() or keyword.iskeyword(out.name):
        raise RnnccError(
            f"{out}: a package folder needs a Python identifier as its name "
            f"(its import name), not {out.name!r}"
        )
    if out.exists() and not (out / "cell.json").is_file():
        raise RnnccError(
            f"{out} exists and is not an rnncc package: not replacing it; "
            "remove it or choose another output folder"
        )
    backward = derive_backward(cell)
    data = dump_cells(cell, backward)
    data["rnncc_version"] = __version__
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        (tmp / "cell.json").write_text(json.dumps(data, indent=1) + "\n")
        (tmp / "cell.rnn").write_text(cell.source.text if cell.source else "", encoding="utf-8")
        path = cell.source.path if cell.source else "<string>"
        init = _INIT.format(name=cell.name, path=path, version=__version__, package=out.name)
        (tmp / "__init__.py").write_text(init, encoding="utf-8")
        kernels = tmp / "kernels"
        kernels.mkdir()
        src = generate_stepwise(cell, backward)
        (kernels / src.filename).write_text(src.text, encoding="utf-8")
        for header in src.headers:
            shutil.copyfile(templates_dir() / header, kernels / header)
        for name, text in (plan or {}).items():
            (tmp / name).write_text(text, encoding="utf-8")
        # mkdtemp makes the folder private (0700); give it the mode a plain mkdir would.
        mode = (tmp / "cell.json").stat().st_mode & 0o666
        os.chmod(tmp, mode | (mode & 0o444) >> 2)
        if out.exists():
            old = out.with_name(f".{out.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(out, old)
            try:
                os.replace(tmp, out)
            except BaseException:
                os.replace(old, out)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def load_package(path: Path) -> CompiledCell:
    """The ``CompiledCell`` stored in a package's ``cell.json``."""
    cell, backward = load_cells(json.loads(Path(path).read_text()))
    return CompiledCell(cell, backward_ir=backward)
