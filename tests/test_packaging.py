"""Packaging: the wheel carries the grammar and templates, and installed rnncc finds them.

Builds a wheel from a copy of the repository (so that no stale ``build/`` of the checkout leaks
into it and the checkout stays clean), inspects it, installs it into a fresh venv and runs
``import rnncc``, ``python -m rnncc --help`` and the ``rnncc`` console script from a directory
outside the repository; does the same for an editable install. Also checks the CI contract:
``.ci/run`` finds the README's test command, and its ruff and mypy pins match the ``dev`` extra.

The venvs are made with ``--system-site-packages`` and install rnncc with ``--no-deps`` so that
torch is never downloaded; when the tests themselves run in a venv (CI), that only reaches the
base interpreter, so the running environment's site-packages are added with a ``.pth`` file.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# What a wheel is built from; everything else of the checkout stays out of the copy.
SOURCE_ITEMS = ("pyproject.toml", "README.md", "LICENSE", "rnncc", "grammar", "templates")
DATA_DIRS = ("grammar", "templates")


def _run(cmd: list[str | Path], *, cwd: Path, timeout: float = 120) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INPUT"] = "1"
    proc = subprocess.run(
        [str(c) for c in cmd],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, (
        f"command failed ({proc.returncode}): {' '.join(map(str, cmd))}\n"
        f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    )
    return proc.stdout


def _files_under(root: Path) -> set[str]:
    return {
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def _copy_source(dest: Path) -> Path:
    dest.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name in SOURCE_ITEMS:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        elif src.is_file():
            shutil.copy2(src, dest / name)
    return dest


def _make_venv(path: Path) -> Path:
    """A fresh venv that sees the running environment's packages (torch, lark, pip, ...)."""
    _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", path], cwd=REPO)
    python = path / "bin" / "python"
    purelib = _run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=path
    ).strip()
    outer = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    Path(purelib, "_rnncc_test_outer.pth").write_text("\n".join(outer) + "\n")
    return python


def _pip_install(python: Path, *args: str | Path) -> None:
    # --ignore-installed: the outer environment may hold rnncc already (CI's editable install).
    _run(
        [python, "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", *args],
        cwd=python.parent,
    )


def _check_installed(python: Path, outside: Path, expected_root: Path) -> None:
    """From ``outside``, rnncc imports from ``expected_root`` and finds its data there."""
    probe = (
        "import rnncc, rnncc.resources as r\n"
        "print(rnncc.__file__)\n"
        "print(r.grammar_path())\n"
        "print(r.templates_dir())\n"
        "print(r.builtin_cell_path('lstm'))\n"
    )
    module, grammar, templates, lstm = _run([python, "-c", probe], cwd=outside).splitlines()
    root = expected_root.resolve()
    for shown in (module, grammar, templates, lstm):
        assert Path(shown).resolve().is_relative_to(root), f"{shown} is not under {root}"
    assert Path(grammar).name == "rnncc.lark" and Path(grammar).is_file()
    assert Path(templates).is_dir()

    for cmd in ([python, "-m", "rnncc", "--help"], [python.parent / "rnncc", "--help"]):
        out = _run(cmd, cwd=outside)
        assert "usage" in out.lower(), f"{cmd}: no usage text in:\n{out}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert (REPO / "grammar" / "rnncc.lark").is_file(), "grammar/rnncc.lark is missing"
    base = tmp_path_factory.mktemp("wheel")
    source = _copy_source(base / "src")
    out = base / "dist"
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    _run([*pip_wheel, "--no-index", "-w", out, source], cwd=base, timeout=300)
    (built,) = out.glob("rnncc-*.whl")
    return built


@pytest.mark.slow
def test_wheel_contents(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "rnncc/grammar/rnncc.lark" in names

    # Every file of the data folders and every module of the package is in the wheel; a
    # file missing here needs its suffix in package-data or its package in pyproject.toml.
    for folder in DATA_DIRS:
        expected = {f"rnncc/{folder}/{name}" for name in _files_under(REPO / folder)}
        assert expected <= names, f"not in the wheel: {sorted(expected - names)}"
    modules = {f"rnncc/{name}" for name in _files_under(REPO / "rnncc") if name.endswith(".py")}
    assert modules <= names, f"not in the wheel: {sorted(modules - names)}"
    cells = {f"rnncc/cells/{p.name}" for p in (REPO / "rnncc" / "cells").glob("*.rnn")}
    assert cells and cells <= names, f"built-in cells not in the wheel: {sorted(cells - names)}"

    tops = {name.split("/", 1)[0] for name in names}
    (dist_info,) = tops - {"rnncc"}
    assert re.fullmatch(r"rnncc-[^/]+\.dist-info", dist_info), tops
    entry_points = zipfile.ZipFile(wheel).read(f"{dist_info}/entry_points.txt").decode()
    assert re.search(r"^rnncc\s*=\s*rnncc\.cli:main$", entry_points, re.MULTILINE)


@pytest.mark.slow
def test_installed_wheel_finds_its_data(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    python = _make_venv(venv)
    _pip_install(python, wheel)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    _check_installed(python, outside, expected_root=venv)


@pytest.mark.slow
def test_editable_install_finds_the_source_tree(tmp_path: Path) -> None:
    assert (REPO / "grammar" / "rnncc.lark").is_file(), "grammar/rnncc.lark is missing"
    source = _copy_source(tmp_path / "src")
    python = _make_venv(tmp_path / "venv")
    _pip_install(python, "--no-build-isolation", "-e", source)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    _check_installed(python, outside, expected_root=source)


def test_source_tree_resources() -> None:
    import rnncc
    from rnncc import resources

    if not Path(rnncc.__file__).resolve().is_relative_to(REPO):
        pytest.skip("rnncc is not imported from this checkout")
    assert resources.grammar_path() == REPO / "grammar" / "rnncc.lark"
    assert resources.templates_dir() == REPO / "templates"
    with pytest.raises(FileNotFoundError, match=r"'nope\.lark' not found.*rnncc\.lark"):
        resources.grammar_path("nope.lark")
    with pytest.raises(ValueError, match="bare file name"):
        resources.grammar_path("../pyproject.toml")


def test_missing_data_folder_says_where_it_looked(tmp_path: Path) -> None:
    # A copy of the module in a folder with neither rnncc/grammar nor a checkout around it.
    from rnncc import resources

    copy = tmp_path / "pkg" / "resources.py"
    copy.parent.mkdir()
    shutil.copy2(resources.__file__, copy)
    spec = importlib.util.spec_from_file_location("_rnncc_resources_copy", copy)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(FileNotFoundError, match="templates/ folder is missing") as info:
        module.templates_dir()
    assert str(tmp_path / "pkg" / "templates") in str(info.value)


def test_ci_runs_the_readme_test_command() -> None:
    out = _run(["bash", REPO / ".ci" / "run", "--print-test-command"], cwd=REPO)
    (command,) = out.splitlines()
    assert "pytest" in command


def _fake_checkout(tmp_path: Path, readme: str | None) -> Path:
    (tmp_path / ".ci").mkdir()
    shutil.copy2(REPO / ".ci" / "run", tmp_path / ".ci" / "run")
    if readme is not None:
        (tmp_path / "README.md").write_text(readme)
    return tmp_path / ".ci" / "run"


def test_ci_extracts_the_command_between_the_markers(tmp_path: Path) -> None:
    readme = (
        "# x\n\n<!-- test-command -->\n```bash\npip install -e . && python -m pytest\n```\n"
        "<!-- /test-command -->\n\nmore text\n"
    )
    out = _run(["bash", _fake_checkout(tmp_path, readme), "--print-test-command"], cwd=tmp_path)
    assert out == "pip install -e . && python -m pytest\n"


@pytest.mark.parametrize(
    ("readme", "message"),
    [
        (None, "not found"),
        ("no markers here\n", "marker"),
        ("<!-- test-command -->\npython -m pytest\n<!-- /test-command -->\n", "```bash"),
        ("<!-- test-command -->\n```bash\na\nb\n```\n<!-- /test-command -->\n", "exactly one"),
        ("<!-- test-command -->\n```bash\nmake\n```\n<!-- /test-command -->\n", "pytest"),
    ],
)
def test_ci_fails_loudly_without_a_test_command(
    tmp_path: Path, readme: str | None, message: str
) -> None:
    script = _fake_checkout(tmp_path, readme)
    for args in (["--print-test-command"], []):  # the real run must stop before installing
        proc = subprocess.run(
            ["bash", str(script), *args], cwd=tmp_path, capture_output=True, text=True, timeout=60
        )
        assert proc.returncode != 0
        assert message in proc.stderr
        assert "venv" not in proc.stdout


@pytest.mark.parametrize("tool", ["ruff", "mypy"])
def test_ci_pins_match_the_dev_extra(tool: str) -> None:
    ci = (REPO / ".ci" / "run").read_text()
    (ci_version,) = re.findall(rf'^{tool.upper()}_VERSION="([^"]+)"$', ci, re.MULTILINE)
    dev = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert f"{tool}=={ci_version}" in dev["dev"]
