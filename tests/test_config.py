"""rnncc.config: environment knobs → a frozen Config; overrides for tests."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rnncc import config as cfg
from rnncc.config import Config, ConfigError, get_config, override
from rnncc.errors import RnnccError

KNOBS = (
    "RNNCC_CACHE_DIR",
    "RNNCC_DUMP_DIR",
    "RNNCC_VERBOSE",
    "RNNCC_QUIET",
    "MAX_JOBS",
    "XDG_CACHE_HOME",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in KNOBS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def test_defaults(tmp_path: Path) -> None:
    c = Config.from_env()
    assert c.cache_dir == tmp_path / "home" / ".cache" / "rnncc"
    assert c.dump_dir is None
    assert c.verbose is False
    assert c.quiet is False
    assert c.max_jobs is None


def test_xdg_cache_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert Config.from_env().cache_dir == tmp_path / "xdg" / "rnncc"


def test_relative_xdg_cache_home_is_ignored(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    assert Config.from_env().cache_dir == tmp_path / "home" / ".cache" / "rnncc"


def test_cache_dir_wins_over_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("RNNCC_CACHE_DIR", str(tmp_path / "mine"))
    assert Config.from_env().cache_dir == tmp_path / "mine"


def test_paths_are_absolute_and_expanded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RNNCC_CACHE_DIR", "~/kernels")
    monkeypatch.setenv("RNNCC_DUMP_DIR", "dumps")
    c = Config.from_env()
    assert c.cache_dir == tmp_path / "home" / "kernels"
    # Made absolute when read, so a later chdir does not move them.
    assert c.dump_dir == tmp_path / "dumps"
    assert c.cache_dir.is_absolute() and c.dump_dir.is_absolute()


def test_empty_means_unset(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("RNNCC_CACHE_DIR", "RNNCC_DUMP_DIR", "RNNCC_VERBOSE", "RNNCC_QUIET", "MAX_JOBS"):
        monkeypatch.setenv(name, "")
    assert Config.from_env() == Config(cache_dir=tmp_path / "home" / ".cache" / "rnncc")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        *[("1", True), ("true", True), ("YES", True), (" on ", True)],
        *[("0", False), ("false", False), ("No", False), ("off", False), ("", False)],
    ],
)
@pytest.mark.parametrize(
    ("name", "field"), [("RNNCC_VERBOSE", "verbose"), ("RNNCC_QUIET", "quiet")]
)
def test_bools(
    monkeypatch: pytest.MonkeyPatch, name: str, field: str, raw: str, expected: bool
) -> None:
    monkeypatch.setenv(name, raw)
    assert getattr(Config.from_env(), field) is expected


@pytest.mark.parametrize("name", ["RNNCC_VERBOSE", "RNNCC_QUIET"])
@pytest.mark.parametrize("raw", ["2", "maybe", "tru"])
def test_bad_bool_names_the_variable(monkeypatch: pytest.MonkeyPatch, name: str, raw: str) -> None:
    monkeypatch.setenv(name, raw)
    with pytest.raises(ConfigError, match=f"{name}='{raw}'"):
        Config.from_env()


def test_max_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAX_JOBS", " 3 ")
    assert Config.from_env().max_jobs == 3


@pytest.mark.parametrize("raw", ["0", "-1", "two", "1.5", "+2", "٣"])
def test_bad_max_jobs(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("MAX_JOBS", raw)
    with pytest.raises(ConfigError, match="MAX_JOBS"):
        Config.from_env()


def test_max_jobs_reaches_the_build_where_torch_reads_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An override's max_jobs, or the environment's in a spelling torch would ignore, is the
    MAX_JOBS torch.utils.cpp_extension sees while building; the environment is put back."""
    from torch.utils import cpp_extension

    from rnncc.runtime import build

    seen: list[str | None] = []
    monkeypatch.setattr(cpp_extension, "load", lambda **_: seen.append(os.environ.get("MAX_JOBS")))
    monkeypatch.setenv("MAX_JOBS", " 3 ")
    with override(cache_dir=tmp_path, max_jobs=1):
        build._run_build("x", [], tmp_path, [], cuda=False)
    build._run_build("x", [], tmp_path, [], cuda=False)  # the environment's, normalised
    monkeypatch.delenv("MAX_JOBS")
    build._run_build("x", [], tmp_path, [], cuda=False)
    assert seen == ["1", "3", None]
    assert "MAX_JOBS" not in os.environ


@pytest.mark.parametrize("name", ["RNNCC_CACHE_DIR", "RNNCC_DUMP_DIR"])
def test_a_tilde_path_that_cannot_expand_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv(name, "~no_such_user_of_rnncc/cache")
    with pytest.raises(ConfigError, match=f"{name}='~no_such_user_of_rnncc/cache': cannot expand"):
        Config.from_env()


def test_no_home_for_the_default_cache_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    with pytest.raises(ConfigError, match="set RNNCC_CACHE_DIR"):
        Config.from_env({})


def test_a_bad_build_variable_does_not_stop_what_builds_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """MAX_JOBS is torch's variable too (set for other builds, torch ignores what it cannot
    read): checking, showing and loading a cell read only RNNCC_DUMP_DIR."""
    import rnncc
    from rnncc.cli import main

    monkeypatch.setenv("MAX_JOBS", "auto")
    monkeypatch.setenv("RNNCC_CACHE_DIR", "~no_such_user_of_rnncc/cache")
    lstm = str(Path(__file__).resolve().parents[1] / "examples" / "lstm.rnn")
    assert main(["check", lstm]) == 0
    assert rnncc.load(lstm).name == "lstm"
    assert rnncc.load_builtin("gru").name == "gru"
    with pytest.raises(ConfigError, match="MAX_JOBS='auto'"):
        get_config()  # where a build reads it


def test_config_error_is_an_rnncc_error_and_a_value_error() -> None:
    assert issubclass(ConfigError, RnnccError)
    assert issubclass(ConfigError, ValueError)


def test_from_env_takes_an_explicit_mapping(tmp_path: Path) -> None:
    c = Config.from_env({"RNNCC_CACHE_DIR": str(tmp_path), "RNNCC_VERBOSE": "1"})
    assert c == Config(cache_dir=tmp_path, verbose=True)


def test_config_is_frozen(tmp_path: Path) -> None:
    c = Config(cache_dir=tmp_path)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.verbose = True  # type: ignore[misc]


def test_constructor_validates(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        Config(cache_dir=tmp_path, max_jobs=0)
    with pytest.raises(ConfigError):
        Config(cache_dir=tmp_path, max_jobs=True)
    with pytest.raises(ConfigError):
        Config(cache_dir=tmp_path, verbose="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="quiet must be a bool"):
        Config(cache_dir=tmp_path, quiet=1)  # type: ignore[arg-type]


def test_get_config_reads_the_environment_on_each_call(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RNNCC_CACHE_DIR", str(tmp_path / "a"))
    assert get_config().cache_dir == tmp_path / "a"
    monkeypatch.setenv("RNNCC_CACHE_DIR", str(tmp_path / "b"))
    assert get_config().cache_dir == tmp_path / "b"


def test_override_nests_and_restores(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RNNCC_CACHE_DIR", str(tmp_path / "env"))
    with override(cache_dir=tmp_path / "outer", verbose=True) as outer:
        assert get_config() is outer
        assert outer.cache_dir == tmp_path / "outer" and outer.verbose
        # The environment no longer counts inside an override: it is a snapshot.
        monkeypatch.setenv("RNNCC_VERBOSE", "0")
        assert get_config().verbose is True
        with override(dump_dir=str(tmp_path / "dump")) as inner:
            assert inner.cache_dir == tmp_path / "outer"  # inherited from the outer override
            assert inner.dump_dir == tmp_path / "dump"  # str accepted, stored as Path
            assert get_config() is inner
        assert get_config() is outer
    assert get_config().cache_dir == tmp_path / "env"
    assert get_config().verbose is False


def test_override_restores_when_the_block_raises(tmp_path: Path) -> None:
    before = get_config()
    with pytest.raises(RuntimeError), override(max_jobs=2):
        raise RuntimeError("boom")
    assert get_config() == before
    assert cfg._overrides == []


def test_equal_nested_overrides_unwind_in_order(tmp_path: Path) -> None:
    with override(cache_dir=tmp_path) as a:
        with override() as b:
            assert a == b and a is not b
        assert get_config() is a
    assert cfg._overrides == []


def test_override_rejects_unknown_fields() -> None:
    with pytest.raises(TypeError), override(cache_dirr="/tmp"):
        pass
    assert cfg._overrides == []


def test_override_validates_values(tmp_path: Path) -> None:
    with pytest.raises(ConfigError), override(max_jobs=-4):
        pass


def test_nothing_is_read_at_import(tmp_path: Path) -> None:
    # Import with one value in the environment, change it, then ask: the new value must win.
    code = (
        "import os, rnncc, rnncc.config as c\n"
        "os.environ['RNNCC_CACHE_DIR'] = os.environ['AFTER']\n"
        "print(c.get_config().cache_dir)\n"
    )
    repo = Path(cfg.__file__).resolve().parents[1]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]),
        "RNNCC_CACHE_DIR": str(tmp_path / "before"),
        "AFTER": str(tmp_path / "after"),
    }
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == str(tmp_path / "after")
