"""The build cache: content keys, one build under concurrency, and BuildError messages."""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from pathlib import Path

import pytest

from rnncc.config import override
from rnncc.errors import BuildError
from rnncc.runtime import build
from rnncc.runtime.build import arch_flags, build_library, cache_key


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
