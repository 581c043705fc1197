"""Writing files so that a reader never sees one half-written: the one helper that the build
cache and compiled packages both use."""

from __future__ import annotations

import os
from pathlib import Path


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write ``path`` (``str`` as UTF-8) through a new temporary file beside it and
    ``os.replace``: a reader sees the old file or the whole new one, and a failed write
    leaves no temporary behind. The file gets the mode a plain ``open`` would give it."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    while True:
        tmp = path.with_name(f".{path.name}.{os.urandom(4).hex()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
