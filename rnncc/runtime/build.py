"""Building generated sources into libraries, through a content-addressed cache.

Input: a library's name, its source files (name → text), and flags. Output: the path of the
built shared library, built at most once per content: the cache key hashes the rnncc
version, every source and header text, the flags, the torch and CUDA versions and the target
arch; the directory is ``$RNNCC_CACHE_DIR/<name>-<key16>/`` (readable). Batch size and
sequence length never enter a key: they are runtime arguments of every kernel.

Concurrency: a build holds an exclusive ``fcntl`` lock on ``<dir>.lock`` and re-checks for a
finished build after acquiring it, so two processes asking at once build once; a build is
finished when its ``BUILT`` marker exists, written atomically (temp file, ``os.replace``)
after the library. Each real build appends a line to ``$RNNCC_CACHE_DIR/builds.log``.

Builds run ``torch.utils.cpp_extension.load`` (ninja) in the cache directory, quiet unless
``RNNCC_VERBOSE``; a compiler failure raises ``BuildError`` naming the generated file and the
first compiler errors. Builds may run in several threads at once (the benchmark tools build
variants in parallel): a build captures only its own thread's prints (``_captured_stdout``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from rnncc import __version__
from rnncc.config import get_config
from rnncc.errors import BuildError

#: nvcc flags of every generated kernel library (CI compiles with these too).
NVCC_FLAGS = ("-O3", "-std=c++17", "-lineinfo")
#: g++ flags of the host library.
CXX_FLAGS = ("-O3", "-std=c++17")


def arch_flags(arch: str) -> list[str]:
    """``-gencode`` flags for an arch like ``sm_90a`` or ``sm_80``."""
    m = re.fullmatch(r"sm_(\d+)(a?)", arch)
    if not m:
        raise BuildError(f"unknown CUDA arch {arch!r}; expected e.g. sm_90a or sm_80")
    num, suffix = m.groups()
    return [f"-gencode=arch=compute_{num}{suffix},code=sm_{num}{suffix}"]


def device_arch(device: object = None) -> str:
    """The arch to build for on a CUDA device: ``sm_90a`` on Hopper (wgmma needs the ``a``)."""
    import torch

    major, minor = torch.cuda.get_device_capability(device)  # type: ignore[arg-type]
    return f"sm_{major}{minor}a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"


def cache_key(parts: Mapping[str, str]) -> str:
    """sha256 over named parts, order-independent in the mapping, stable across runs."""
    h = hashlib.sha256()
    for name in sorted(parts):
        h.update(name.encode())
        h.update(b"\0")
        h.update(parts[name].encode())
        h.update(b"\0")
    return h.hexdigest()


def toolchain_parts(arch: str) -> dict[str, str]:
    import torch

    return {
        "rnncc": __version__,
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
        "arch": arch,
    }


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _first_errors(log: str, limit: int = 8) -> str:
    """The compiler's own error lines (not ninja's command lines), else the log's tail."""
    lines = [
        ln
        for ln in log.splitlines()
        if re.search(r"\berror\b", ln, re.IGNORECASE) and not ln.startswith("Error building")
    ]
    return "\n".join(lines[:limit]) or "\n".join(log.splitlines()[-limit:])


def build_library(
    name: str,
    sources: Mapping[str, str],
    *,
    arch: str,
    headers: Sequence[Path] = (),
    cuda: bool = True,
    extra_parts: Mapping[str, str] | None = None,
) -> Path:
    """Build (or find in the cache) the shared library of ``sources``; see the module
    docstring. ``headers`` are copied beside the sources and hashed into the key."""
    flags = list(NVCC_FLAGS) + arch_flags(arch)
    parts = dict(toolchain_parts(arch))
    parts.update({f"src:{k}": v for k, v in sources.items()})
    parts.update({f"hdr:{p.name}": p.read_text() for p in headers})
    parts["flags"] = " ".join(flags + list(CXX_FLAGS))
    parts.update(extra_parts or {})
    key = cache_key(parts)
    root = get_config().cache_dir
    directory = root / f"{name}-{key[:16]}"
    ext_name = f"{re.sub(r'[^A-Za-z0-9_]', '_', name)}_{key[:16]}"
    library = directory / f"{ext_name}.so"
    marker = directory / "BUILT"
    if marker.exists() and library.exists():
        return library
    with _locked(root / f"{name}-{key[:16]}.lock"):
        if marker.exists() and library.exists():  # another process built it meanwhile
            return library
        directory.mkdir(parents=True, exist_ok=True)
        paths = []
        for fname, text in sources.items():
            _atomic_write(directory / fname, text)
            paths.append(str(directory / fname))
        for header in headers:
            _atomic_write(directory / header.name, header.read_text())
        started = time.time()
        _run_build(ext_name, paths, directory, flags, cuda)
        info = {"name": name, "key": key, "seconds": round(time.time() - started, 2), **parts}
        info = {
            k: v for k, v in info.items() if not k.startswith("src:") and not k.startswith("hdr:")
        }
        _atomic_write(marker, json.dumps(info, indent=1) + "\n")
        with open(root / "builds.log", "a") as log:
            log.write(f"{name}-{key[:16]} {os.getpid()} {info['seconds']}\n")
    return library


class _ThreadStdout(io.TextIOBase):
    """``sys.stdout`` while builds run: a capturing thread's writes go to its buffer, other
    threads' to the stream it replaced. (``contextlib.redirect_stdout`` swaps the one global
    stream: with builds in several threads, one thread's restore could leave another's buffer
    in place, and everything printed after it was lost.)"""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.buffers: dict[int, io.StringIO] = {}

    def write(self, text: str) -> int:
        buffer = self.buffers.get(threading.get_ident())
        return (buffer if buffer is not None else self.stream).write(text)

    def flush(self) -> None:
        self.stream.flush()

    # The stream's own (TextIOBase declares them as plain attributes, read-only at runtime).
    @property
    def encoding(self) -> Any:  # type: ignore[override]
        return self.stream.encoding

    @property
    def errors(self) -> Any:  # type: ignore[override]
        return self.stream.errors

    def fileno(self) -> int:
        return int(self.stream.fileno())

    def isatty(self) -> bool:
        return bool(self.stream.isatty())


_stdout_lock = threading.Lock()


@contextlib.contextmanager
def _captured_stdout(buffer: io.StringIO) -> Iterator[None]:
    """This thread's prints into ``buffer`` for the block, other threads' untouched."""
    with _stdout_lock:
        if not isinstance(sys.stdout, _ThreadStdout):
            sys.stdout = _ThreadStdout(sys.stdout)
        proxy = sys.stdout
        proxy.buffers[threading.get_ident()] = buffer
    try:
        yield
    finally:
        with _stdout_lock:
            del proxy.buffers[threading.get_ident()]
            if not proxy.buffers and sys.stdout is proxy:
                sys.stdout = proxy.stream


def _run_build(
    ext_name: str, sources: list[str], directory: Path, flags: list[str], cuda: bool
) -> None:
    from torch.utils import cpp_extension

    verbose = get_config().verbose
    captured = io.StringIO()
    try:
        with _captured_stdout(captured) if not verbose else contextlib.nullcontext():
            cpp_extension.load(
                name=ext_name,
                sources=sources,
                extra_cflags=list(CXX_FLAGS),
                extra_cuda_cflags=flags,
                extra_include_paths=[str(directory)],
                build_directory=str(directory),
                with_cuda=cuda,
                is_python_module=False,
                verbose=verbose,
            )
    except (RuntimeError, OSError) as err:
        log = f"{err}\n{captured.getvalue()}"
        failing = ", ".join(sources)
        raise BuildError(
            f"building {failing} failed (build folder {directory}):\n{_first_errors(log)}"
        ) from None
