"""Every environment knob of rnncc, read in one place, typed, and overridable in tests.

Input: the process environment, read when :func:`get_config` (or :meth:`Config.from_env`) is
called. Output: a frozen :class:`Config`.

=================  ========================================================================
variable           meaning
=================  ========================================================================
RNNCC_CACHE_DIR    where built kernels are cached; default ``$XDG_CACHE_HOME/rnncc``, else
                   ``~/.cache/rnncc``
RNNCC_DUMP_DIR     if set, every compiler stage (AST, IR, backward IR, plan, sources) is
                   written there, like Triton's dumps
RNNCC_VERBOSE      ``1``/``true``/``yes``/``on`` shows the compiler's build output
RNNCC_QUIET        ``1`` (same spellings) silences the line on stderr that says a kernel
                   build started and how long it took (and the one saying a build waits for
                   another process's)
RNNCC_POISON       ``1``: the CUDA backends fill outputs and workspaces with NaN before their
                   kernels run, so an element a kernel fails to write shows (for tests)
MAX_JOBS           parallel compile jobs for the kernel build (the variable
                   ``torch.utils.cpp_extension`` reads); unset lets ninja decide
=================  ========================================================================

Invariants: nothing is read at import time; every path in a ``Config`` is absolute (a relative
value is taken relative to the working directory at the time it is read, so a later ``chdir``
does not move the cache); a malformed value raises :class:`ConfigError` naming the variable.
Inside ``with override(...)`` :func:`get_config` returns the overridden snapshot and ignores
the environment; outside, it reads the environment afresh on every call (it is cheap), so
``monkeypatch.setenv`` works too.

Non-goals: a configuration file; knobs that torch or nvcc already read themselves
(``TORCH_CUDA_ARCH_LIST``, ``CUDA_HOME``) other than ``MAX_JOBS``, which the build stage passes
on explicitly so that an override reaches the build; thread safety of ``override`` (tests only).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rnncc.errors import RnnccError

__all__ = ["Config", "ConfigError", "get_config", "override"]

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})


class ConfigError(RnnccError, ValueError):
    """An environment variable of rnncc holds a value it cannot use."""


@dataclass(frozen=True)
class Config:
    """The settings rnncc runs with; build one with :meth:`from_env` or :func:`override`."""

    cache_dir: Path
    dump_dir: Path | None = None
    verbose: bool = False
    quiet: bool = False
    max_jobs: int | None = None
    poison: bool = False

    def __post_init__(self) -> None:
        # Accept str/PathLike (handy in tests) but store absolute Paths.
        object.__setattr__(self, "cache_dir", _abs_path("RNNCC_CACHE_DIR", self.cache_dir))
        if self.dump_dir is not None:
            object.__setattr__(self, "dump_dir", _abs_path("RNNCC_DUMP_DIR", self.dump_dir))
        for flag in ("verbose", "quiet", "poison"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(f"{flag} must be a bool, got {getattr(self, flag)!r}")
        if self.max_jobs is not None and (
            isinstance(self.max_jobs, bool) or not isinstance(self.max_jobs, int)
        ):
            raise ConfigError(f"max_jobs must be an int or None, got {self.max_jobs!r}")
        if self.max_jobs is not None and self.max_jobs < 1:
            raise ConfigError(f"max_jobs must be at least 1, got {self.max_jobs}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Config:
        """Read the knobs from ``environ`` (default: ``os.environ``); empty means unset."""
        env = os.environ if environ is None else environ
        cache = env.get("RNNCC_CACHE_DIR", "")
        dump = env.get("RNNCC_DUMP_DIR", "")
        return cls(
            cache_dir=Path(cache) if cache else _default_cache_dir(env),
            dump_dir=Path(dump) if dump else None,
            verbose=_parse_bool("RNNCC_VERBOSE", env.get("RNNCC_VERBOSE", "")),
            quiet=_parse_bool("RNNCC_QUIET", env.get("RNNCC_QUIET", "")),
            max_jobs=_parse_jobs("MAX_JOBS", env.get("MAX_JOBS", "")),
            poison=_parse_bool("RNNCC_POISON", env.get("RNNCC_POISON", "")),
        )


def _abs_path(name: str, value: str | os.PathLike[str]) -> Path:
    try:
        return Path(value).expanduser().absolute()
    except RuntimeError as err:  # `~user` of no user, or `~` without a home directory
        raise ConfigError(f"{name}={str(value)!r}: cannot expand '~' ({err})") from None


def _default_cache_dir(env: Mapping[str, str]) -> Path:
    # The XDG spec says to ignore a relative XDG_CACHE_HOME.
    xdg = env.get("XDG_CACHE_HOME", "")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "rnncc"
    try:
        return Path.home() / ".cache" / "rnncc"
    except RuntimeError as err:
        raise ConfigError(
            f"no home directory for the default cache ~/.cache/rnncc ({err}): set "
            "RNNCC_CACHE_DIR (or XDG_CACHE_HOME) to a writable folder"
        ) from None


def _parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}={raw!r}: expected one of 1/0, true/false, yes/no, on/off")


def _parse_jobs(name: str, raw: str) -> int | None:
    value = raw.strip()
    if not value:
        return None
    # digits only, as torch.utils.cpp_extension reads it (it ignores "+2" or "2.0")
    jobs = int(value) if value.isascii() and value.isdigit() else 0
    if jobs < 1:
        raise ConfigError(f"{name}={raw!r}: expected a positive number of jobs")
    return jobs


_overrides: list[Config] = []


def get_config() -> Config:
    """The configuration in force: the innermost :func:`override`, else the environment."""
    return _overrides[-1] if _overrides else Config.from_env()


def get_dump_dir() -> Path | None:
    """``get_config().dump_dir`` reading only ``RNNCC_DUMP_DIR``: the front end asks it of
    every compile, which builds nothing, so another variable's bad value (a ``MAX_JOBS=auto``
    set for other builds) does not stop ``rnncc check`` or ``rnncc.load``."""
    if _overrides:
        return _overrides[-1].dump_dir
    raw = os.environ.get("RNNCC_DUMP_DIR", "")
    return _abs_path("RNNCC_DUMP_DIR", raw) if raw else None


@contextmanager
def override(**changes: object) -> Iterator[Config]:
    """Run a block with some fields replaced, e.g. ``with override(cache_dir=tmp_path):``.

    The other fields are a snapshot of :func:`get_config` on entry; overrides nest, and the
    previous configuration comes back on exit, also when the block raises. An unknown field
    name raises ``TypeError``.
    """
    config = dataclasses.replace(get_config(), **changes)  # type: ignore[arg-type]
    _overrides.append(config)
    try:
        yield config
    finally:
        # By identity, not equality: an equal outer override must stay in place.
        index = max(i for i, c in enumerate(_overrides) if c is config)
        del _overrides[index]
