"""The kernel cache on disk and ``rnncc cache``: listing entries (kernel, size, age, in use),
clearing and pruning without touching entries in use, locks that survive a clear, and
one-line errors."""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rnncc.cli import main
from rnncc.config import override
from rnncc.errors import BuildError, RnnccError
from rnncc.runtime import build, cache
from rnncc.runtime.build import build_library
from rnncc.runtime.cache import entry_lock, lock_path


@pytest.fixture
def fake_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Builds that write a library of ``size`` bytes (the source's first line, ``// N``)."""

    def fake_run(ext_name, sources, directory, flags, cuda):
        size = int(Path(sources[0]).read_text().split()[1])
        (Path(directory) / f"{ext_name}.so").write_bytes(b"\0" * size)

    monkeypatch.setattr(build, "_run_build", fake_run)
    monkeypatch.setattr(build, "toolchain_parts", lambda arch: {"arch": arch})


def _build(root: Path, name: str, size: int, what: str | None = None) -> Path:
    with override(cache_dir=root, quiet=True):
        return build_library(name, {"k.cu": f"// {size}\n"}, arch="sm_90a", description=what)


def _cli(capsys: pytest.CaptureFixture[str], root: Path, *argv: str) -> tuple[int, str, str]:
    with override(cache_dir=root):
        try:
            rc = main(["cache", *argv])
        except SystemExit as exit_:  # argparse usage errors
            rc = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


@contextlib.contextmanager
def _mapped(path: Path) -> Iterator[None]:
    """Map ``path`` into this process, as loading a library does."""
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ):
        yield


def _table(out: str) -> list[list[str]]:
    return [re.split(r"\s{2,}", line) for line in out.splitlines()[1:]]


def test_list_a_cache_that_does_not_exist(capsys, tmp_path):
    root = tmp_path / "nowhere"
    assert _cli(capsys, root, "list") == (0, f"kernel cache {root}: empty\n", "")
    assert not root.exists()


def test_list_shows_entry_kernel_size_age_and_in_use(capsys, tmp_path, fake_builds):
    lstm = _build(tmp_path, "rnncc_lstm_stepwise", 2048, "lstm stepwise kernels (sm_90a)")
    gru = _build(tmp_path, "rnncc_gru_fused_d64", 10, "gru fused kernels (head dim 64, sm_90a)")
    unfinished = tmp_path / "rnncc_elman_stepwise-0123456789abcdef"  # a build that never finished
    lock_path(unfinished).touch()  # taken before the folder is made
    unfinished.mkdir()
    with _mapped(gru), entry_lock(lock_path(lstm.parent)):
        rc, out, err = _cli(capsys, tmp_path, "list")
    assert (rc, err) == (0, "")
    assert out.splitlines()[0].startswith(f"kernel cache {tmp_path}: 3 entries, ")
    rows = {row[0]: row[1:] for row in _table(out)}
    assert rows.pop("entry") == ["kernel", "size", "age", "in use"]
    assert rows[lstm.parent.name][0] == "lstm stepwise kernels (sm_90a)"
    assert rows[lstm.parent.name][1].endswith(" KiB") and rows[lstm.parent.name][2] == "0 s"
    assert rows[lstm.parent.name][3] == "building"
    assert rows[gru.parent.name][0] == "gru fused kernels (head dim 64, sm_90a)"
    if os.access(f"/proc/{os.getpid()}/maps", os.R_OK):  # mapped by this process
        assert rows[gru.parent.name][3] == f"pid {os.getpid()}"
    assert rows["rnncc_elman_stepwise-0123456789abcdef"] == ["unfinished build", "0 B", "0 s"]


def test_clear_removes_the_matching_entries_and_their_locks(capsys, tmp_path, fake_builds):
    lstm = _build(tmp_path, "rnncc_lstm_stepwise", 10)
    gru = _build(tmp_path, "rnncc_gru_stepwise", 10)
    rc, out, err = _cli(capsys, tmp_path, "clear", "rnncc_gru_*", "nothing*")
    assert (rc, err) == (0, "")
    assert re.fullmatch(rf"removed 1 entry \(\d+ B\) from {re.escape(str(tmp_path))}\n", out)
    assert not gru.parent.exists() and not lock_path(gru.parent).exists()
    assert lstm.exists()
    rc, out, err = _cli(capsys, tmp_path, "clear")
    assert not lstm.parent.exists() and not lock_path(lstm.parent).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["builds.log"]


def test_clear_keeps_entries_in_use_and_says_so(capsys, tmp_path, fake_builds):
    building = _build(tmp_path, "rnncc_lstm_stepwise", 10)
    loaded = _build(tmp_path, "rnncc_gru_stepwise", 10)
    idle = _build(tmp_path, "rnncc_elman_stepwise", 10)
    maps = os.access(f"/proc/{os.getpid()}/maps", os.R_OK)
    with _mapped(loaded), entry_lock(lock_path(building.parent)):
        rc, out, err = _cli(capsys, tmp_path, "clear")
    assert (rc, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].startswith(f"removed {1 if maps else 2} entr")
    assert f"kept {building.parent.name}: in use (building)" in lines
    assert building.exists() and not idle.parent.exists()
    if maps:
        assert f"kept {loaded.parent.name}: in use (pid {os.getpid()})" in lines
        assert loaded.exists()


def test_prune_removes_unfinished_then_least_recently_used(capsys, tmp_path, fake_builds):
    old, used, new = (_build(tmp_path, f"lib{k}", 100 << 10) for k in range(3))
    now = time.time()
    os.utime(old, (now - 3000, now - 3000))  # (access, modification)
    os.utime(used, (now, now - 2000))  # built before `new`, loaded since
    os.utime(new, (now - 1000, now - 1000))
    unfinished = tmp_path / "lib3-0123456789abcdef"
    unfinished.mkdir()
    (unfinished / "k.o").write_bytes(b"\0" * 10)
    cache.lock_path(unfinished).touch()  # a build takes it before it makes the folder
    rc, out, err = _cli(capsys, tmp_path, "prune", "--max-size", "250K")
    assert (rc, err) == (0, "")
    assert out.startswith("removed 2 entries (100.")
    assert not unfinished.exists() and not old.exists()
    assert used.exists() and new.exists()
    assert re.fullmatch(r"the cache holds 20\d\.\d KiB", out.splitlines()[-1])
    rc, out, err = _cli(capsys, tmp_path, "prune", "--max-size", "150K")
    assert used.exists() and not new.exists()
    rc, out, err = _cli(capsys, tmp_path, "prune", "--max-size", "1M")
    assert out.startswith("removed 0 entries (0 B)")


def test_folders_that_are_not_entries_are_never_touched(capsys, tmp_path, fake_builds):
    """RNNCC_CACHE_DIR may name a folder the user shares (``~/.cache``, ``$TMPDIR``): list,
    clear and prune see only the folders rnncc names (``<name>-<16 hex digits>``)."""
    lstm = _build(tmp_path, "rnncc_lstm_stepwise", 10)
    theirs = [tmp_path / "pip", tmp_path / "huggingface" / "hub", tmp_path / "notes-2026"]
    # named as an entry is (a timestamp is hex digits), but with no manifest or lock: a user's
    theirs.append(tmp_path / "backup-2024010112300000")
    for folder in theirs:
        folder.mkdir(parents=True)
        (folder / "data.bin").write_bytes(b"\0" * 1000)
    elsewhere = tmp_path.parent / f"{tmp_path.name}-linked"
    elsewhere.mkdir()
    (elsewhere / "BUILT").write_text("{}")
    (tmp_path / "link-0123456789abcdef").symlink_to(elsewhere, target_is_directory=True)
    theirs.append(elsewhere)
    (elsewhere / "data.bin").write_bytes(b"\0" * 1000)
    rc, out, err = _cli(capsys, tmp_path, "list")
    assert (rc, err) == (0, "") and len(_table(out)) == 2 and "pip" not in out  # header, entry
    rc, out, err = _cli(capsys, tmp_path, "prune", "--max-size", "0")
    assert (rc, err) == (0, "") and out.startswith("removed 1 entry")
    assert not lstm.exists()
    _build(tmp_path, "rnncc_lstm_stepwise", 10)
    rc, out, err = _cli(capsys, tmp_path, "clear")
    assert (rc, err) == (0, "") and out.startswith("removed 1 entry")
    assert all((folder / "data.bin").stat().st_size == 1000 for folder in theirs)


def test_manifests_record_times_the_builds_give_them(tmp_path, fake_builds):
    _build(tmp_path, "lib", 10)
    (entry,) = cache.list_entries(tmp_path)
    assert entry.manifest is not None and abs(entry.built_at - time.time()) < 60
    assert entry.name == "lib" and entry.in_use == ""


@pytest.mark.parametrize("command", [["list"], ["clear"], ["prune", "--max-size", "1G"]])
def test_an_unusable_cache_is_one_line_without_traceback(capsys, tmp_path, command):
    (tmp_path / "file").write_text("")
    root = tmp_path / "file" / "cache"
    assert _cli(capsys, root, *command) == (
        1,
        "",
        f"rnncc: error: cannot read the kernel cache at {root} (Not a directory): "
        "set RNNCC_CACHE_DIR to a writable folder\n",
    )


def test_prune_needs_a_size(capsys, tmp_path):
    rc, out, err = _cli(capsys, tmp_path, "prune", "--max-size", "lots")
    assert (rc, out) == (2, "")
    assert err.endswith(
        "rnncc cache prune: error: argument --max-size: not a size: 'lots' "
        "(expected e.g. 2G, 500M, 1.5GiB)\n"
    )


@pytest.mark.parametrize(
    ("text", "size"),
    [("1000", 1000), ("2G", 2 << 30), ("500m", 500 << 20), ("1.5GiB", 3 << 29), ("4 KB", 4096)],
)
def test_parse_size(text, size):
    assert cache.parse_size(text) == size


def test_format_size_and_age():
    assert [cache.format_size(n) for n in (0, 1023, 1536, 5 << 20, 3 << 30)] == [
        "0 B",
        "1023 B",
        "1.5 KiB",
        "5.0 MiB",
        "3.0 GiB",
    ]
    assert [cache.format_age(s) for s in (-1, 59, 60, 7200, 200000)] == [
        "0 s",
        "59 s",
        "1 min",
        "2 h",
        "2 d",
    ]


def test_a_lock_whose_file_was_cleared_is_taken_again_on_the_new_file(tmp_path):
    """A waiter that wins the lock of a file `rnncc cache clear` deleted must not go on while
    another process holds the lock file now at that path."""
    path = tmp_path / "entry.lock"
    waited: list[str] = []
    inside = threading.Event()

    def waiter() -> None:
        with entry_lock(path, on_wait=lambda: waited.append("waiting")):
            inside.set()

    cleared = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(cleared, fcntl.LOCK_EX)
    thread = threading.Thread(target=waiter)
    thread.start()
    deadline = time.monotonic() + 10
    while not waited and time.monotonic() < deadline:
        time.sleep(0.01)
    os.unlink(path)  # as `rnncc cache clear` does while holding the lock
    current = os.open(path, os.O_RDWR | os.O_CREAT)  # the next build's lock file
    fcntl.flock(current, fcntl.LOCK_EX)
    os.close(cleared)
    time.sleep(0.3)
    assert not inside.is_set()
    os.close(current)
    thread.join(timeout=10)
    assert waited == ["waiting"] and inside.is_set()


@pytest.mark.parametrize("bad", ["c$x", "c:x"])
def test_a_cache_path_the_build_cannot_take_is_refused_before_building(tmp_path, bad, fake_builds):
    """torch's ninja file escapes only spaces: a '$' or ':' in the cache's path made every
    build fail with ninja's 'missing and no known rule'. Refused first, naming the way out."""
    root = tmp_path / bad
    with pytest.raises(BuildError, match=r"its path holds '[$:]'.*set RNNCC_CACHE_DIR"):
        _build(root, "lib", 10)
    with pytest.raises(RnnccError, match="set RNNCC_CACHE_DIR"):
        cache.ensure_writable(root)
    assert not root.exists()
    _build(tmp_path / "with space", "lib", 10)  # spaces it escapes
