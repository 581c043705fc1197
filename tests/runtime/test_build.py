"""The build cache: content keys, one build under concurrency, manifests and damaged entries,
killed builds, an unwritable cache, progress lines, BuildError messages, and the checks
``rnncc compile --prebuild`` makes before it writes anything."""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rnncc.cli import main
from rnncc.config import override
from rnncc.errors import BuildError, RnnccWarning
from rnncc.runtime import build
from rnncc.runtime.build import arch_flags, build_library, cache_key
from rnncc.runtime.cache import check_entry

REPO = Path(__file__).resolve().parents[2]


def test_cache_key_is_stable_and_content_addressed():
    a = cache_key({"src": "x", "flags": "-O3"})
    assert a == cache_key({"flags": "-O3", "src": "x"})
    assert a != cache_key({"src": "y", "flags": "-O3"})
    assert a != cache_key({"src": "x", "flags": "-O2"})
    assert cache_key({"a": "bc"}) != cache_key({"ab": "c"})


def test_arch_flags():
    assert arch_flags("sm_90a") == ["-gencode=arch=compute_90a,code=sm_90a"]
    assert arch_flags("sm_80") == ["-gencode=arch=compute_80,code=sm_80"]
    with pytest.raises(BuildError, match="unknown CUDA arch 'hopper'"):
        arch_flags("hopper")


def _fake_builds(monkeypatch, delay: float = 0.3) -> list[str]:
    calls: list[str] = []

    def fake_run(ext_name, sources, directory, flags, cuda):
        calls.append(ext_name)
        time.sleep(delay)  # long enough for the other builder to queue on the lock
        (Path(directory) / f"{ext_name}.so").write_bytes(b"\x7fELF")

    monkeypatch.setattr(build, "_run_build", fake_run)
    monkeypatch.setattr(build, "toolchain_parts", lambda arch: {"arch": arch})
    return calls


def test_concurrent_builders_build_once(tmp_path, monkeypatch):
    calls = _fake_builds(monkeypatch)
    results: list[Path] = []
    with override(cache_dir=tmp_path):

        def worker():
            results.append(build_library("cell", {"cell.cu": "// same"}, arch="sm_90a"))

        threads = [threading.Thread(target=worker) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(calls) == 1
    assert len(set(results)) == 1 and results[0].exists()
    assert len((tmp_path / "builds.log").read_text().splitlines()) == 1
    assert results[0].parent.name.startswith("cell-")
    assert (results[0].parent / "BUILT").exists()


def test_changed_source_builds_again_unfinished_build_is_redone(tmp_path, monkeypatch):
    calls = _fake_builds(monkeypatch, delay=0)
    with override(cache_dir=tmp_path):
        first = build_library("cell", {"cell.cu": "// one"}, arch="sm_90a")
        assert build_library("cell", {"cell.cu": "// one"}, arch="sm_90a") == first
        other = build_library("cell", {"cell.cu": "// two"}, arch="sm_90a")
        assert other != first
        (first.parent / "BUILT").unlink()  # as if a build had died before finishing
        assert build_library("cell", {"cell.cu": "// one"}, arch="sm_90a") == first
    assert len(calls) == 3


@pytest.mark.slow
def test_compiler_errors_raise_build_error_with_file_and_errors(tmp_path, monkeypatch):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        if os.environ.get("CI"):
            pytest.fail("nvcc is not on PATH")
        pytest.skip("nvcc is not installed here")
    # A CPU build of torch does not look for the CUDA toolkit; point it at the one on PATH.
    monkeypatch.setattr("torch.utils.cpp_extension.CUDA_HOME", str(Path(nvcc).resolve().parents[1]))
    broken = '#include <cuda_runtime.h>\nextern "C" int f() { return undeclared_name; }\n'
    with override(cache_dir=tmp_path), pytest.raises(BuildError) as info:
        build_library("broken", {"broken.cu": broken}, arch="sm_90a")
    message = str(info.value)
    assert "broken.cu" in message
    assert "undeclared_name" in message and "error" in message
    assert not list(tmp_path.glob("broken-*/BUILT"))


def test_builds_in_threads_capture_only_their_own_prints(tmp_path, monkeypatch, capsys):
    # Each fake build prints an error line, waits until every build is inside its own, prints
    # another: with one global redirect, a thread's restore left another's buffer installed,
    # and the first thread's second line and everything printed later went astray.
    barrier = threading.Barrier(4)

    def fake_load(name, **kwargs):
        print(f"{name}.cu(1): error: first")
        barrier.wait(timeout=10)
        print(f"{name}.cu(2): error: second")
        raise RuntimeError("ninja failed")

    monkeypatch.setattr("torch.utils.cpp_extension.load", fake_load)
    errors: dict[int, str] = {}

    def run(k: int) -> None:
        with pytest.raises(BuildError) as info:
            build._run_build(f"lib{k}", [f"lib{k}.cu"], tmp_path, [], cuda=True)
        errors[k] = str(info.value)

    stdout = sys.stdout
    with override(cache_dir=tmp_path, verbose=False):
        threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sys.stdout is stdout
    print("after the builds")
    assert capsys.readouterr().out == "after the builds\n"
    for k in range(4):  # each error carries its own build's two lines and no other's
        assert [ln for ln in errors[k].splitlines() if "error:" in ln] == [
            f"lib{k}.cu(1): error: first",
            f"lib{k}.cu(2): error: second",
        ]


def test_the_manifest_records_the_library_its_size_hash_key_parts_and_plan(tmp_path, monkeypatch):
    _fake_builds(monkeypatch, delay=0)
    with override(cache_dir=tmp_path, quiet=True):
        lib = build_library("cell", {"cell.cu": "// one"}, arch="sm_90a", plan={"warps": 4})
        assert build_library("cell", {"cell.cu": "// one"}, arch="sm_90a", plan={"warps": 8}) != lib
    manifest = check_entry(lib.parent)
    assert manifest is not None
    assert (manifest.name, manifest.library, manifest.size) == ("cell", lib.name, 4)
    assert manifest.sha256 == hashlib.sha256(b"\x7fELF").hexdigest()
    assert lib.parent.name == f"cell-{manifest.key[:16]}"
    assert manifest.plan == {"warps": 4}
    assert dict(manifest.parts) == {
        "arch": "sm_90a",
        "flags": " ".join(build.NVCC_FLAGS + tuple(arch_flags("sm_90a")) + build.CXX_FLAGS),
        "manifest": "1",
    }
    assert json.loads((lib.parent / "BUILT").read_text())["format"] == 1


DAMAGES = {
    # A new file rather than a write into the old one: a library some process maps stays whole.
    "truncated": lambda lib: _replace(lib, b"\x7f"),
    "same size": lambda lib: _replace(lib, b"\x7fELG"),
    "missing": lambda lib: lib.unlink(),
    "manifest": lambda lib: (lib.parent / "BUILT").write_text("garbage"),
}


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name("new")
    tmp.write_bytes(data)
    os.replace(tmp, path)


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_entry_is_rebuilt_with_a_one_line_warning(tmp_path, monkeypatch, damage):
    calls = _fake_builds(monkeypatch, delay=0)
    with override(cache_dir=tmp_path, quiet=True):
        lib = build_library("cell", {"cell.cu": "// one"}, arch="sm_90a")
        DAMAGES[damage](lib)
        with pytest.warns(RnnccWarning) as record:
            assert build_library("cell", {"cell.cu": "// one"}, arch="sm_90a") == lib
        assert build_library("cell", {"cell.cu": "// one"}, arch="sm_90a") == lib
    entry = f"rnncc: cache entry {lib.parent}"
    why = {
        "truncated": f"{entry}: {lib.name} has size 1, its manifest records 4",
        "same size": f"{entry}: {lib.name} differs from its manifest's sha256",
        "missing": f"{entry}: {lib.name} is missing (No such file or directory)",
        "manifest": f"{entry} has a malformed manifest (Expecting value: line 1 column 1 (char 0))",
    }[damage]
    assert [str(w.message) for w in record] == [f"{why}; rebuilding it"]
    assert len(calls) == 2
    assert lib.read_bytes() == b"\x7fELF" and check_entry(lib.parent) is not None


def test_progress_lines_on_stderr_unless_quiet(tmp_path, monkeypatch, capsys):
    _fake_builds(monkeypatch, delay=0)
    what = "lstm stepwise kernels (sm_90a)"
    with override(cache_dir=tmp_path, quiet=False):
        build_library("cell", {"cell.cu": "// one"}, arch="sm_90a", description=what)
        build_library("cell", {"cell.cu": "// one"}, arch="sm_90a", description=what)  # cached
        out, err = capsys.readouterr()
        assert out == ""
        assert re.fullmatch(
            rf"rnncc: building {re.escape(what)}…\nrnncc: built {re.escape(what)} in \d+\.\d s\n",
            err,
        )
        build_library("cell", {"cell.cu": "// two"}, arch="sm_90a")  # named by default
        assert capsys.readouterr().err.splitlines()[0] == "rnncc: building cell (sm_90a)…"
    with override(cache_dir=tmp_path, quiet=True):
        build_library("cell", {"cell.cu": "// three"}, arch="sm_90a")
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("where", ["under a file", "a file"])
def test_an_unwritable_cache_says_what_failed_and_what_to_do(tmp_path, monkeypatch, where):
    _fake_builds(monkeypatch, delay=0)
    (tmp_path / "file").write_text("")
    root = tmp_path / "file" / "cache" if where == "under a file" else tmp_path / "file"
    with override(cache_dir=root), pytest.raises(BuildError) as info:
        build_library("cell", {"cell.cu": "// one"}, arch="sm_90a")
    assert str(info.value) == (
        f"cannot write the kernel cache at {root} (Not a directory): "
        "set RNNCC_CACHE_DIR to a writable folder"
    )


def test_a_read_only_cache_still_serves_its_built_entries(tmp_path, monkeypatch):
    _fake_builds(monkeypatch, delay=0)
    with override(cache_dir=tmp_path, quiet=True):
        lib = build_library("cell", {"cell.cu": "// one"}, arch="sm_90a")

        def read_only(*args, **kwargs):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))

        # Every way the build path writes starts with the folder or the lock.
        monkeypatch.setattr(Path, "mkdir", read_only)
        monkeypatch.setattr(build, "entry_lock", read_only)
        assert build_library("cell", {"cell.cu": "// one"}, arch="sm_90a") == lib
        with pytest.raises(BuildError) as info:
            build_library("cell", {"cell.cu": "// two"}, arch="sm_90a")
    assert str(info.value) == (
        f"cannot write the kernel cache at {tmp_path} (Read-only file system): "
        "set RNNCC_CACHE_DIR to a writable folder"
    )


# ---- real builds of C++ libraries (g++, no CUDA) -----------------------------------------

TINY = 'extern "C" int answer() { return 42; }\n'
# Enough optimised functions for g++ to take a few seconds, so the build can be killed midway.
SLOW = (
    "".join(
        f"long g{i}(long x) {{ for (int k = 0; k < {i % 13 + 3}; ++k) "
        f"x = x * {i} + (x >> 3) ^ {i * 7}; return x; }}\n"
        for i in range(500)
    )
    + 'extern "C" long answer() { return g1(1); }\n'
)
BUILD_SCRIPT = """
import sys
from pathlib import Path
from rnncc.runtime.build import build_library
source = Path(sys.argv[1]).read_text()
print(build_library("slow", {"slow.cpp": source}, arch="sm_90a", cuda=False))
"""


def _needs_compiler() -> None:
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler here")


@pytest.mark.slow
def test_a_build_killed_midway_does_not_hang_the_next(tmp_path):
    """torch's baton file (``lock`` in the entry) outlives a killed build; the next build of
    the same library used to wait for it forever."""
    _needs_compiler()
    cache = tmp_path / "cache"
    source = tmp_path / "slow.cpp"
    source.write_text(SLOW)
    env = dict(
        os.environ,
        RNNCC_CACHE_DIR=str(cache),
        RNNCC_QUIET="1",
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    )
    cmd = [sys.executable, "-c", BUILD_SCRIPT, str(source)]
    # Its own session, so the kill takes ninja and the compiler too (as Ctrl-C or a job
    # scheduler's timeout does).
    first = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not list(cache.glob("slow-*/lock")):
            assert first.poll() is None, "the build ended before it could be killed"
            assert time.monotonic() < deadline, "torch's baton never appeared"
            time.sleep(0.01)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    assert list(cache.glob("slow-*/lock")), "the build finished before the kill"
    assert not list(cache.glob("slow-*/BUILT"))
    try:
        again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        pytest.fail("the build after a killed one hung (torch's stale baton file)")
    assert again.returncode == 0, again.stderr
    library = Path(again.stdout.strip())
    assert check_entry(library.parent) is not None
    assert not (library.parent / "lock").exists()


@pytest.mark.slow
def test_a_library_cleared_from_the_cache_is_rebuilt_in_the_same_process(tmp_path):
    """torch remembers the libraries it built in this process and would skip the build."""
    _needs_compiler()
    with override(cache_dir=tmp_path, quiet=True):
        first = build_library("tiny", {"tiny.cpp": TINY}, arch="sm_90a", cuda=False)
        shutil.rmtree(first.parent)
        again = build_library("tiny", {"tiny.cpp": TINY}, arch="sm_90a", cuda=False)
    assert again == first and check_entry(again.parent) is not None
    assert ctypes.CDLL(str(again)).answer() == 42


# ---- rnncc compile --prebuild: checks before anything is written --------------------------


def _prebuild(capsys, tmp_path: Path, *extra: str) -> tuple[int, str, str]:
    lstm = str(REPO / "examples" / "lstm.rnn")
    rc = main(["compile", lstm, "-o", str(tmp_path / "pkg"), "--prebuild", *extra])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def cuda_toolchain(monkeypatch):
    """As if torch were a CUDA build and nvcc installed (on a machine with neither)."""
    import torch

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr("torch.utils.cpp_extension.CUDA_HOME", "/usr/local/cuda")


def test_prebuild_with_a_cpu_torch_says_so_and_writes_nothing(capsys, tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.version, "cuda", None)
    rc, out, err = _prebuild(capsys, tmp_path, "--arch", "sm_90a")
    assert (rc, out) == (1, "")
    assert err == (
        f"rnncc: error: this torch ({torch.__version__}) is a CPU build: "
        "--prebuild needs a CUDA build of torch\n"
    )
    assert not (tmp_path / "pkg").exists()


def test_prebuild_without_nvcc_says_so_and_writes_nothing(capsys, tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr("torch.utils.cpp_extension.CUDA_HOME", None)
    monkeypatch.setenv("PATH", str(tmp_path))
    rc, out, err = _prebuild(capsys, tmp_path, "--arch", "sm_90a")
    assert (rc, out) == (1, "")
    assert err == (
        "rnncc: error: no CUDA compiler: nvcc is not on PATH and CUDA_HOME is not set; "
        "--prebuild needs the CUDA toolkit\n"
    )
    assert not (tmp_path / "pkg").exists()


def test_prebuild_without_a_gpu_or_arch_writes_nothing(
    capsys, tmp_path, monkeypatch, cuda_toolchain
):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("RNNCC_CACHE_DIR", str(tmp_path / "cache"))
    rc, out, err = _prebuild(capsys, tmp_path)
    assert (rc, out) == (1, "")
    assert err == ("rnncc: error: no CUDA device here: name the target with --arch (e.g. sm_90a)\n")
    assert not (tmp_path / "pkg").exists()


def test_prebuild_into_an_unwritable_cache_writes_nothing(
    capsys, tmp_path, monkeypatch, cuda_toolchain
):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("RNNCC_CACHE_DIR", str(tmp_path / "file" / "cache"))
    rc, out, err = _prebuild(capsys, tmp_path, "--arch", "sm_90a")
    assert (rc, out) == (1, "")
    assert err == (
        f"rnncc: error: cannot write the kernel cache at {tmp_path / 'file' / 'cache'} "
        "(Not a directory): set RNNCC_CACHE_DIR to a writable folder\n"
    )
    assert not (tmp_path / "pkg").exists()
