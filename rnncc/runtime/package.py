"""Compiled cell packages: what ``rnncc compile FILE -o DIR`` writes and how it loads.

DIR becomes an importable Python package (its name must be an identifier, not a keyword):
``cell.json`` (forward and backward IR with the source, ``rnncc.ir.serialize``), ``cell.rnn``
(the source as written), ``kernels/`` (the generated CUDA and headers of the stepwise kernels
and, when sizes were given, of the variant the plan chose: the bytes the runtime generates),
``plan.txt`` / ``plan.json`` when sizes were given, and
``__init__.py``, which loads ``cell.json`` into ``cell`` without running the front end.

``.rnncc-package.json``, the manifest, lists every file rnncc wrote. A recompile replaces
exactly those files and leaves every other file alone; a folder that is not empty and has no
manifest is refused. Each file is replaced atomically, ``cell.json`` and ``__init__.py`` last,
so an import never sees a half-written file. docs/compile.md describes the rules.
"""

from __future__ import annotations

import errno
import json
import keyword
import os
import stat
import sys
import unicodedata
from collections.abc import Mapping, Sequence
from importlib.resources.abc import Traversable
from pathlib import Path, PurePosixPath
from typing import Any

from rnncc import __version__
from rnncc.autodiff import derive_backward
from rnncc.codegen.escape import json_text, python_string
from rnncc.errors import RnnccError
from rnncc.ir.cell import Cell
from rnncc.ir.serialize import dump_cells
from rnncc.resources import templates_dir
from rnncc.runtime.api import CompiledCell, from_serialized
from rnncc.runtime.files import atomic_write
from rnncc.variants import BY_NAME
from rnncc.variants.stepwise import BUILD as STEPWISE_BUILD

#: The manifest's file name inside a package, and the format it is written in.
MANIFEST = ".rnncc-package.json"
MANIFEST_FORMAT = "rnncc-package/1"

# The docstring holds no user text: the cell's name and path go in literals (python_string).
_INIT = '''"""A cell compiled by rnncc {version}; ``cell`` is loaded from cell.json.

    from {package} import cell, RNN
    y, last = cell(Wx, R, b)          # shapes: see cell.shapes(B, T, NH, D)
    layer = RNN(input_size, hidden_size, num_heads=1)

Generated file: recompile with `rnncc compile` rather than editing it.
"""

from importlib.resources import files as _files

from rnncc.runtime.package import load_package as _load_package

#: The cell's name and the .rnn file it was compiled from.
CELL_NAME = {name}
SOURCE_PATH = {path}

cell = _load_package(_files(__name__) / "cell.json")  # also from a zip file


def RNN(*args, **kwargs):
    """``rnncc.RNN`` with this package's cell."""
    import rnncc

    return rnncc.RNN(cell, *args, **kwargs)
'''


#: Top-level modules a package must not be named after: rnncc and what a package's import of
#: it imports (a package named so shadows them, or is shadowed: ``-o out/rnncc`` imported
#: itself half-initialised). The standard library's names are refused too.
_TAKEN_NAMES = frozenset({"rnncc", "torch", "numpy", "jinja2", "lark", "constraint"})


def write_package(
    cell: Cell,
    out: Path,
    *,
    plan: Mapping[str, str] | None = None,
    builds: Sequence[Mapping[str, Any]] = (STEPWISE_BUILD,),
) -> Path:
    """Write ``out`` as a package of ``cell``, replacing only the files an earlier rnncc
    package there lists in its manifest; ``plan`` maps file names (``plan.txt``,
    ``plan.json``) to their text. Raises ``RnnccError`` before writing anything when the
    folder is not one rnncc may write into."""
    out = Path(out)
    name = Path(os.path.abspath(out)).name  # `-o .` names the current folder
    if not name.isidentifier() or keyword.iskeyword(name):
        raise RnnccError(
            f"{out}: a package folder needs a Python identifier as its name "
            f"(its import name), not {name!r}"
        )
    if name in _TAKEN_NAMES or name in sys.stdlib_module_names:
        owner = (
            "rnncc or a module it needs" if name in _TAKEN_NAMES else "a standard library module"
        )
        raise RnnccError(
            f"{out}: {name!r} is the name of {owner}, which a package so named would shadow "
            "or be shadowed by when imported; name the folder something else"
        )
    if unicodedata.normalize("NFKC", name) != name:  # what `import` looks for on disk
        raise RnnccError(
            f"{out}: Python imports the name {name!r} as "
            f"{unicodedata.normalize('NFKC', name)!r}, so it would not find this folder; "
            "name it that way"
        )
    files = package_files(cell, name, plan or {}, builds)
    for rel in files:
        if not _is_inside(rel):
            raise RnnccError(f"cell '{cell.name}': {rel!r} is not a file name inside a package")
    earlier = _listed_files(out)
    for rel in files:
        _check_writable(out, rel, earlier)
    stale = sorted(set(earlier) - set(files))
    for rel in stale:
        _check_writable(out, rel, earlier)

    out.mkdir(parents=True, exist_ok=True)
    # Until the end the manifest lists the earlier files and the new ones: whatever is
    # interrupted, the next compile finds every file rnncc wrote listed.
    _write_manifest(out, cell, sorted(set(earlier) | set(files)))
    for rel, data in files.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, data)
    for rel in stale:
        (out / rel).unlink(missing_ok=True)
        _remove_empty_folders(out, PurePosixPath(rel).parent)
    _write_manifest(out, cell, sorted(files))
    return out


def package_files(
    cell: Cell,
    package: str,
    plan: Mapping[str, str],
    builds: Sequence[Mapping[str, Any]] = (STEPWISE_BUILD,),
) -> dict[str, bytes]:
    """Every file of the package of ``cell`` named ``package``: relative POSIX path → bytes,
    in the order they are written (``cell.json`` and ``__init__.py`` last). ``builds``: the
    build records of the kernel libraries whose sources go into ``kernels/``."""
    backward = derive_backward(cell)
    files: dict[str, bytes] = {}
    for build in builds:
        src = BY_NAME[build["variant"]].render(cell, backward, build)
        files[f"kernels/{src.filename}"] = src.text.encode("utf-8")
        for header in src.headers:
            files[f"kernels/{header}"] = (templates_dir() / header).read_bytes()
    files["cell.rnn"] = (cell.source.text if cell.source else "").encode("utf-8")
    for name, text in plan.items():
        files[name] = text.encode("utf-8")
    data = dump_cells(cell, backward)
    data["rnncc_version"] = __version__
    files["cell.json"] = json_text(data).encode("ascii")
    init = _INIT.format(
        version=__version__,
        package=package,
        name=python_string(cell.name),
        path=python_string(cell.source.path if cell.source else "<string>"),
    )
    files["__init__.py"] = init.encode("utf-8")
    return files


def load_package(path: str | os.PathLike[str] | Traversable) -> CompiledCell:
    """The ``CompiledCell`` stored in a package's ``cell.json`` (a path, or a resource of an
    imported package, which may live in a zip file)."""
    source = Path(path) if isinstance(path, (str, os.PathLike)) else path
    return from_serialized(json.loads(source.read_text(encoding="utf-8")))


def _is_inside(rel: str) -> bool:
    """Whether ``rel`` names a path below a package folder: relative, POSIX, no ``.`` or
    ``..`` parts, no backslash, not the manifest. Checked on every path a manifest lists, so
    that a hand-edited one cannot make rnncc write or delete outside the folder."""
    if not rel or "\\" in rel or "\0" in rel or rel == MANIFEST:
        return False
    return not rel.startswith("/") and all(p not in ("", ".", "..") for p in rel.split("/"))


def _listed_files(out: Path) -> list[str]:
    """The files the manifest in ``out`` lists; none when ``out`` is absent or empty. Refuses
    a folder with other files and no manifest, and a manifest it cannot read or trust."""
    if not os.path.lexists(out):
        return []
    if not out.is_dir():
        raise RnnccError(
            f"{out} exists and is not a folder: not writing a package there; "
            "choose another folder or remove it"
        )
    manifest = out / MANIFEST
    if not os.path.lexists(manifest):
        if any(out.iterdir()):
            raise RnnccError(
                f"{out} exists and is not an rnncc package (no {MANIFEST}): not writing into "
                "it; choose another folder or remove it"
            )
        return []
    refuse = f"not writing into {out}; choose another folder or remove it"
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise RnnccError(
            f"{manifest}: cannot read the package manifest ({err}): {refuse}"
        ) from None
    fmt = data.get("format") if isinstance(data, dict) else None
    files = data.get("files") if isinstance(data, dict) else None
    if fmt != MANIFEST_FORMAT or not isinstance(files, list):
        raise RnnccError(
            f"{manifest}: not a package manifest this rnncc reads (format {fmt!r}; this rnncc "
            f"writes {MANIFEST_FORMAT!r}): {refuse}"
        )
    for rel in files:
        if not isinstance(rel, str) or not _is_inside(rel):
            raise RnnccError(
                f"{manifest} lists {rel!r}, which is not a file inside {out}: {refuse}"
            )
    return files


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


def _check_writable(out: Path, rel: str, listed: list[str]) -> None:
    """Refuse unless rnncc may write or delete ``out/rel``: its folders inside ``out`` are real
    folders (no symbolic link leads out), and the path is absent or a regular file the
    manifest lists. Raises ``RnnccError`` naming what is in the way."""
    parts = rel.split("/")
    for k in range(1, len(parts)):
        folder = out.joinpath(*parts[:k])
        try:
            mode = folder.lstat().st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(mode):
            raise RnnccError(
                f"{folder} is {_kind(mode)}, where rnncc keeps package files: not writing into "
                f"{out}; move it away or choose another folder"
            )
    path = out / rel
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if rel not in listed:
        raise RnnccError(
            f"{path} exists and rnncc did not write it (it is not listed in {MANIFEST}): not "
            "replacing it; move it away or choose another folder"
        )
    if not stat.S_ISREG(mode):
        raise RnnccError(
            f"{path} is listed in {MANIFEST} as a file rnncc wrote but is now {_kind(mode)}: "
            "not replacing it; move it away or choose another folder"
        )


def _write_manifest(out: Path, cell: Cell, files: list[str]) -> None:
    manifest = {
        "format": MANIFEST_FORMAT,
        "rnncc_version": __version__,
        "cell": cell.name,
        "files": files,
    }
    atomic_write(out / MANIFEST, json_text(manifest).encode("ascii"))


def _remove_empty_folders(out: Path, folder: PurePosixPath) -> None:
    """Remove ``out/folder`` and its parents below ``out`` while they are empty: folders that
    held only files rnncc wrote and has now removed."""
    while folder.parts:
        try:
            os.rmdir(out / folder)
        except OSError as err:
            if err.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                return
            raise
        folder = folder.parent
