"""Building generated sources into libraries, through a content-addressed cache.

Input: a library's name, its source files (name → text), and flags. Output: the path of the
built shared library, built at most once per content: the cache key hashes the rnncc
version, every source and header text, the flags, the torch and CUDA versions, the target
arch and the caller's launch ``plan``; the entry is ``$RNNCC_CACHE_DIR/<name>-<key16>/``
(layout and manifest: ``rnncc.runtime.cache``). Batch size and sequence length never enter a
key: they are runtime arguments of every kernel.

A finished entry is used when its library matches the size and sha256 in its manifest; that
check takes no lock and writes nothing, so a read-only cache keeps serving what it holds. A
build holds the entry's lock and re-checks after acquiring it, so concurrent askers build
once; a damaged entry is rebuilt with a warning, and what a killed build left (torch's baton
file, which would make the next build wait forever, and a half-written library) is removed
first. The manifest is written atomically after the library; each build appends a line to
``$RNNCC_CACHE_DIR/builds.log`` and prints its start and time on stderr unless
``RNNCC_QUIET``.

Builds run ``torch.utils.cpp_extension.load`` (ninja) in the entry, quiet unless
``RNNCC_VERBOSE``; a compiler failure raises ``BuildError`` naming the generated file and the
first compiler errors. Builds may run in several threads at once (the benchmark tools build
variants in parallel): a build captures only its own thread's prints (``_captured_stdout``).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import sys
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rnncc import __version__
from rnncc.config import get_config
from rnncc.errors import BuildError, RnnccError, RnnccWarning
from rnncc.runtime.cache import (
    MANIFEST_FORMAT,
    DamagedEntryError,
    Manifest,
    check_buildable,
    check_entry,
    entry_dir,
    entry_lock,
    file_sha256,
    lock_path,
    unusable,
    write_manifest,
)
from rnncc.runtime.files import atomic_write

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
    description: str | None = None,
    plan: Mapping[str, Any] | None = None,
) -> Path:
    """Build (or find in the cache) the shared library of ``sources``; see the module
    docstring. ``headers`` are copied beside the sources and hashed into the key;
    ``description`` names the library in the progress line (e.g. ``lstm stepwise kernels
    (sm_90a)``); ``plan`` (JSON data) is hashed into the key and kept in the manifest."""
    flags = list(NVCC_FLAGS) + arch_flags(arch)
    parts = dict(toolchain_parts(arch))
    parts.update({f"src:{k}": v for k, v in sources.items()})
    parts.update({f"hdr:{p.name}": p.read_text() for p in headers})
    parts["flags"] = " ".join(flags + list(CXX_FLAGS))
    parts["manifest"] = str(MANIFEST_FORMAT)
    if plan is not None:
        parts["plan"] = json.dumps(plan, sort_keys=True)
    parts.update(extra_parts or {})
    key = cache_key(parts)
    root = get_config().cache_dir
    directory = entry_dir(root, name, key)
    ext_name = f"{re.sub(r'[^A-Za-z0-9_]', '_', name)}_{key[:16]}"
    library = directory / f"{ext_name}.so"
    with contextlib.suppress(DamagedEntryError):  # rebuilt below, if still damaged under the lock
        if check_entry(directory, library.name) is not None:
            return library
    recorded = {
        k: v for k, v in parts.items() if not k.startswith(("src:", "hdr:")) and k != "plan"
    }
    job = _Job(name, key, description or f"{name} ({arch})", recorded, plan)
    try:
        check_buildable(root)
    except RnnccError as err:
        raise BuildError(str(err)) from None
    try:
        root.mkdir(parents=True, exist_ok=True)
        with entry_lock(lock_path(directory), on_wait=job.waiting):
            return _build_entry(job, directory, library, sources, headers, flags, cuda)
    except OSError as err:  # the cache's own files; the compiler's failures are BuildErrors
        raise BuildError(unusable(root, err)) from None


@dataclass(frozen=True)
class _Job:
    """What a build records in its manifest and says on stderr, besides its sources."""

    name: str
    key: str
    description: str
    parts: dict[str, str]
    plan: Mapping[str, Any] | None

    def waiting(self) -> None:
        _progress(f"waiting for another build of {self.description}…")


def _progress(message: str) -> None:
    """One line on stderr about a build, unless ``RNNCC_QUIET``."""
    if not get_config().quiet:
        print(f"rnncc: {message}", file=sys.stderr, flush=True)


def _build_entry(
    job: _Job,
    directory: Path,
    library: Path,
    sources: Mapping[str, str],
    headers: Sequence[Path],
    flags: list[str],
    cuda: bool,
) -> Path:
    """The build proper, under the entry's lock: re-check, clean, compile, record."""
    try:
        if check_entry(directory, library.name) is not None:  # built meanwhile by another
            return library
    except DamagedEntryError as err:
        warnings.warn(f"rnncc: {err}; rebuilding it", RnnccWarning, stacklevel=3)
        # From scratch: ninja would take a damaged library newer than its inputs as built.
        shutil.rmtree(directory)
    # No other rnncc build of this entry runs while we hold its lock, so torch's baton file
    # here is a killed build's (torch would wait for it forever), and so is a library without
    # a manifest (possibly half-written). Ninja reruns any step its log does not show done.
    for stale in (directory / "lock", library):
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()
    directory.mkdir(exist_ok=True)
    paths = []
    for fname, text in sources.items():
        atomic_write(directory / fname, text)
        paths.append(str(directory / fname))
    for header in headers:
        atomic_write(directory / header.name, header.read_text())
    _progress(f"building {job.description}…")
    started = time.monotonic()
    _run_build(library.stem, paths, directory, flags, cuda)
    seconds = round(time.monotonic() - started, 2)
    manifest = Manifest(
        name=job.name,
        key=job.key,
        library=library.name,
        size=library.stat().st_size,
        sha256=file_sha256(library),
        description=job.description,
        seconds=seconds,
        built_at=time.time(),
        parts=job.parts,
        plan=job.plan,
    )
    write_manifest(directory, manifest)
    with open(directory.parent / "builds.log", "a") as log:
        log.write(f"{directory.name} {os.getpid()} {seconds}\n")
    _progress(f"built {job.description} in {seconds:.1f} s")
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


_jobs_lock = threading.Lock()
_jobs_builds = 0  # builds running under _max_jobs
_jobs_before: str | None = None  # MAX_JOBS as it was before the first of them


@contextlib.contextmanager
def _max_jobs(jobs: int | None) -> Iterator[None]:
    """``MAX_JOBS`` set to ``jobs`` (the configuration's, which may be an ``override``'s or a
    spelling torch ignores, such as `` 4``) while builds run, where torch reads it; put back as
    it was once the last of them ends (builds run in several threads at once)."""
    global _jobs_builds, _jobs_before
    if jobs is None:
        yield
        return
    with _jobs_lock:
        if not _jobs_builds:
            _jobs_before = os.environ.get("MAX_JOBS")
        _jobs_builds += 1
        os.environ["MAX_JOBS"] = str(jobs)
    try:
        yield
    finally:
        with _jobs_lock:
            _jobs_builds -= 1
            if not _jobs_builds:
                if _jobs_before is None:
                    os.environ.pop("MAX_JOBS", None)
                else:
                    os.environ["MAX_JOBS"] = _jobs_before


def _run_build(
    ext_name: str, sources: list[str], directory: Path, flags: list[str], cuda: bool
) -> None:
    from torch.utils import cpp_extension

    config = get_config()
    verbose = config.verbose
    captured = io.StringIO()
    # torch skips building a name it has built before in this process and loads the file
    # left there; after a cleared or damaged entry there is none, or a wrong one.
    cpp_extension.JIT_EXTENSION_VERSIONER.entries.pop(ext_name, None)
    try:
        with (
            _captured_stdout(captured) if not verbose else contextlib.nullcontext(),
            _max_jobs(config.max_jobs),
        ):
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
