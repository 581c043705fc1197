"""The kernel cache on disk: entries, their manifests, their locks, and what ``rnncc cache``
lists and removes.

An entry is the folder ``<name>-<key16>`` under the cache root: a build's sources, ninja's
files, the library, and ``BUILT``, the entry's manifest (JSON: the library's file name, size
and sha256, the key parts, an optional launch ``plan``). ``<name>-<key16>.lock`` beside it is
the lock a build holds. An entry counts as built only when its manifest exists and the library
still has the recorded size and hash (:func:`check_entry`), so a damaged library is rebuilt
rather than loaded. Removing an entry (``clear``, ``prune``) takes its lock first and skips
entries in use: being built, or mapped by a running process (``/proc/*/maps``, where readable).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import fnmatch
import hashlib
import json
import os
import re
import shutil
import stat
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rnncc.errors import RnnccError
from rnncc.runtime.files import atomic_write

#: The manifest's file name in an entry; its presence marks a finished build.
MANIFEST = "BUILT"
#: The manifest layout; a build hashes it into its key, so a new layout never reads an old one.
MANIFEST_FORMAT = 1


class DamagedEntryError(RnnccError):
    """A cache entry's manifest is unreadable or its library does not match it."""


@dataclass(frozen=True)
class Manifest:
    """What ``BUILT`` records about a finished build; ``plan`` is the caller's launch data."""

    name: str
    key: str
    library: str  # file name inside the entry
    size: int
    sha256: str
    description: str
    seconds: float
    built_at: float  # seconds since the epoch
    parts: Mapping[str, str] = field(default_factory=dict)
    plan: Mapping[str, Any] | None = None

    def to_json(self) -> str:
        return json.dumps({"format": MANIFEST_FORMAT, **dataclasses.asdict(self)}, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """Parse a manifest; ``ValueError`` saying what is wrong when it is not one."""
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"not a format-{MANIFEST_FORMAT} manifest")
        types: dict[str, type | tuple[type, ...]] = {
            "name": str,
            "key": str,
            "library": str,
            "size": int,
            "sha256": str,
            "description": str,
            "seconds": (int, float),
            "built_at": (int, float),
            "parts": dict,
            "plan": (dict, type(None)),
        }
        for name, kind in types.items():
            if not isinstance(data.get(name), kind) or isinstance(data.get(name), bool):
                raise ValueError(f"field {name!r} is missing or of the wrong type")
        if "/" in data["library"] or not re.fullmatch(r"[0-9a-f]{64}", data["sha256"]):
            raise ValueError("malformed library name or sha256")
        return cls(**{name: data[name] for name in types})


def entry_dir(root: Path, name: str, key: str) -> Path:
    """The folder of a library's entry: readable name, then the key's first 16 hex digits."""
    return root / f"{name}-{key[:16]}"


#: What :func:`entry_dir` names. A folder so named is rnncc's only where it also has a
#: manifest or the lock file beside it that every build takes before making the folder:
#: anything else in the cache folder is not rnncc's (the folder may be one the user shares,
#: such as ``~/.cache`` or ``$TMPDIR``, where ``backup-2024010112300000`` is a user's) and is
#: never listed, cleared or pruned; nor is a symbolic link.
_ENTRY_NAME = re.compile(r".+-[0-9a-f]{16}")


def _is_entry(directory: Path) -> bool:
    if not _ENTRY_NAME.fullmatch(directory.name) or directory.is_symlink():
        return False
    return directory.is_dir() and ((directory / MANIFEST).exists() or lock_path(directory).exists())


def lock_path(directory: Path) -> Path:
    return directory.with_name(f"{directory.name}.lock")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def read_manifest(directory: Path) -> Manifest | None:
    """The entry's manifest; None when it has none (never built, or a build did not finish).
    Raises :class:`DamagedEntryError` when the manifest cannot be read or parsed."""
    try:
        text = (directory / MANIFEST).read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, UnicodeDecodeError) as err:
        raise DamagedEntryError(
            f"cache entry {directory} has an unreadable manifest ({err})"
        ) from None
    try:
        return Manifest.from_json(text)
    except ValueError as err:  # json.JSONDecodeError is a ValueError
        raise DamagedEntryError(
            f"cache entry {directory} has a malformed manifest ({err})"
        ) from None


def check_entry(directory: Path, library: str | None = None) -> Manifest | None:
    """The manifest of a finished entry whose library has the recorded size and sha256 (and is
    named ``library``, when given); None when the entry has no manifest. Raises
    :class:`DamagedEntryError` with a one-line reason otherwise."""
    manifest = read_manifest(directory)
    if manifest is None:
        return None
    where = f"cache entry {directory}"
    if library is not None and manifest.library != library:
        raise DamagedEntryError(f"{where} names library {manifest.library}, not {library}")
    path = directory / manifest.library
    try:
        size = path.stat().st_size
    except OSError as err:
        raise DamagedEntryError(
            f"{where}: {manifest.library} is missing ({err.strerror})"
        ) from None
    if size != manifest.size:
        raise DamagedEntryError(
            f"{where}: {manifest.library} has size {size}, its manifest records {manifest.size}"
        )
    try:
        digest = file_sha256(path)
    except OSError as err:
        raise DamagedEntryError(
            f"{where}: {manifest.library} is unreadable ({err.strerror})"
        ) from None
    if digest != manifest.sha256:
        raise DamagedEntryError(f"{where}: {manifest.library} differs from its manifest's sha256")
    return manifest


def write_manifest(directory: Path, manifest: Manifest) -> None:
    atomic_write(directory / MANIFEST, manifest.to_json())


@contextlib.contextmanager
def entry_lock(path: Path, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold the exclusive ``fcntl`` lock file ``path`` for the block; ``on_wait`` runs once if
    another holder makes this one wait. ``rnncc cache clear`` deletes lock files, so a lock
    won on a file no longer at ``path`` is dropped and taken again on the new one."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if on_wait is not None:
                    on_wait()
                    on_wait = None
                fcntl.flock(fd, fcntl.LOCK_EX)
            if _same_file(fd, path):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def _try_lock(path: Path, create: bool) -> int | None:
    """A descriptor holding the lock ``path`` now, or None when a build holds it (or, without
    ``create``, when there is no lock file)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT if create else os.O_RDONLY, 0o644)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _being_built(directory: Path) -> bool:
    path = lock_path(directory)
    if not path.exists():
        return False
    fd = _try_lock(path, create=False)
    if fd is None:
        return path.exists()  # a lock file gone meanwhile was cleared, not held
    os.close(fd)
    return False


def _mapped_entries(root: Path) -> dict[str, set[int]]:
    """Entry folder name → ids of the processes that map a file of that entry (libraries a
    process loaded). Processes whose maps this user cannot read are skipped."""
    prefix = f"{os.path.realpath(root)}/"  # the kernel reports resolved paths
    mapped: dict[str, set[int]] = {}
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return mapped
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as fh:
                lines = [ln for ln in fh if prefix in ln]
        except OSError:
            continue
        for line in lines:
            path = line.split(maxsplit=5)[-1].strip()
            if path.startswith(prefix):
                mapped.setdefault(path[len(prefix) :].split("/", 1)[0], set()).add(int(pid))
    return mapped


@dataclass(frozen=True)
class Entry:
    """One cache entry as ``rnncc cache list`` shows it."""

    path: Path
    manifest: Manifest | None  # None: unfinished, or its manifest is damaged
    damaged: bool  # it has a manifest that cannot be read
    size: int  # bytes of every file in the folder
    built_at: float  # the manifest's time, else the folder's modification time
    last_used: float  # the library's access time (file systems update it about daily)
    building: bool
    pids: frozenset[int]  # processes that map its library

    @property
    def name(self) -> str:
        """The library name the entry was built under (its folder name without the key)."""
        return self.manifest.name if self.manifest else self.path.name.rsplit("-", 1)[0]

    @property
    def in_use(self) -> str:
        """Why the entry must stay (``building``, ``pid 12, 34``), or ``""``."""
        if self.building:
            return "building"
        return "pid " + ", ".join(map(str, sorted(self.pids))) if self.pids else ""


def unusable(root: Path, err: OSError, verb: str = "write") -> str:
    """The one-line message of a cache that cannot be used, with the way out."""
    reason = err.strerror or str(err)
    if isinstance(err, FileExistsError) and not root.is_dir():  # mkdir over a regular file
        reason = os.strerror(errno.ENOTDIR)
    return (
        f"cannot {verb} the kernel cache at {root} ({reason}): "
        "set RNNCC_CACHE_DIR to a writable folder"
    )


#: Characters of a path that the build's ninja file (written by torch.utils.cpp_extension,
#: which escapes only spaces) cannot hold.
_NINJA_UNSAFE = "$:\n"


def check_buildable(root: Path) -> None:
    """Raises :class:`RnnccError` where a build under ``root`` cannot work: its path holds a
    character of ``_NINJA_UNSAFE`` (ninja then failed with 'missing and no known rule' or
    'expected newline')."""
    bad = sorted({c for c in str(root) if c in _NINJA_UNSAFE})
    if bad:
        shown = ", ".join(repr(c) for c in bad)
        raise RnnccError(
            f"cannot build in the kernel cache at {root}: its path holds {shown}, which the "
            "build (ninja) cannot take: set RNNCC_CACHE_DIR to a folder without '$', ':' or "
            "line breaks"
        )


def ensure_writable(root: Path) -> None:
    """Create ``root`` if needed and check that a file can be made and a build can run there;
    raises the error of :func:`unusable` or :func:`check_buildable` otherwise (a build checks
    nothing else ahead, it reports what fails)."""
    check_buildable(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".probe.{os.getpid()}.{threading.get_ident()}"
        probe.touch()
        probe.unlink()
    except OSError as err:
        raise RnnccError(unusable(root, err)) from None


def list_entries(root: Path) -> list[Entry]:
    """Every entry under ``root``, oldest build first; empty when ``root`` does not exist."""
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    except OSError as err:
        raise RnnccError(unusable(root, err, "read")) from None
    mapped = _mapped_entries(root)
    entries = []
    for name in names:
        directory = root / name
        if not _is_entry(directory):
            continue
        manifest, damaged = None, False
        try:
            manifest = read_manifest(directory)
        except DamagedEntryError:
            damaged = True
        size, accessed = 0, 0.0
        for path in directory.rglob("*"):
            with contextlib.suppress(OSError):
                st = path.lstat()
                size += st.st_size if stat.S_ISREG(st.st_mode) else 0
        try:
            built_at = manifest.built_at if manifest else directory.stat().st_mtime
        except FileNotFoundError:  # removed meanwhile
            continue
        if manifest is not None:
            with contextlib.suppress(OSError):
                accessed = (directory / manifest.library).stat().st_atime
        entries.append(
            Entry(
                path=directory,
                manifest=manifest,
                damaged=damaged,
                size=size,
                built_at=built_at,
                last_used=accessed or built_at,
                building=_being_built(directory),
                pids=frozenset(mapped.get(name, ())),
            )
        )
    return sorted(entries, key=lambda e: e.built_at)


def remove_entries(root: Path, entries: Sequence[Entry]) -> tuple[list[Entry], list[Entry]]:
    """Delete each entry's folder and lock file, skipping those in use; returns (removed,
    kept). The entry's lock is held while its folder goes, so no build of it runs meanwhile."""
    removed, kept = [], []
    for entry in entries:
        if entry.in_use:
            kept.append(entry)
            continue
        lock = lock_path(entry.path)
        try:
            fd = _try_lock(lock, create=True)
        except OSError as err:
            raise RnnccError(unusable(root, err)) from None
        if fd is None:  # a build started since the listing
            kept.append(dataclasses.replace(entry, building=True))
            continue
        try:
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(entry.path)
            lock.unlink(missing_ok=True)
        except OSError as err:
            raise RnnccError(unusable(root, err)) from None
        finally:
            os.close(fd)
        removed.append(entry)
    return removed, kept


def clear(root: Path, patterns: Sequence[str] = ()) -> tuple[list[Entry], list[Entry]]:
    """Remove the entries whose folder or library name matches a glob of ``patterns`` (all
    entries when there is none); returns (removed, kept in use)."""
    chosen = [
        e
        for e in list_entries(root)
        if not patterns
        or any(
            fnmatch.fnmatchcase(e.path.name, p) or fnmatch.fnmatchcase(e.name, p) for p in patterns
        )
    ]
    return remove_entries(root, chosen)


def prune(root: Path, max_bytes: int) -> tuple[list[Entry], list[Entry]]:
    """Remove entries until the cache holds at most ``max_bytes``: unfinished builds first,
    then the least recently used; returns (removed, kept in use that would have gone)."""
    entries = list_entries(root)
    total = sum(e.size for e in entries)
    order = sorted(entries, key=lambda e: (e.manifest is not None, e.last_used))
    chosen = []
    for entry in order:
        if total <= max_bytes:
            break
        chosen.append(entry)
        if not entry.in_use:
            total -= entry.size
    return remove_entries(root, chosen)


_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes of a size like ``2G``, ``500M``, ``1.5GiB`` or ``1000`` (binary units)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([kmgt]?)(?:i?b)?\s*", text, re.IGNORECASE)
    if m is None:
        raise ValueError(f"not a size: {text!r} (expected e.g. 2G, 500M, 1.5GiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def format_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def format_age(seconds: float) -> str:
    for unit, length in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= length:
            return f"{int(seconds // length)} {unit}"
    return f"{max(0, int(seconds))} s"
