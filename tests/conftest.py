"""Test-suite wiring shared by every test module.

- ``gpu`` marker: a test marked ``@pytest.mark.gpu`` is skipped when
  ``torch.cuda.is_available()`` is false (CI has no GPU); on a GPU machine ``pytest -m gpu``
  selects them. torch is imported only when such a test was collected.
- ``--update-golden``: golden-file tests rewrite their expected files instead of comparing;
  they read the ``update_golden`` fixture.

Non-goals: fixtures of one test area (those live beside its tests).
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite golden files (expected IR, CUDA, ...) from the current output",
    )


def pytest_configure(config: pytest.Config) -> None:
    # Also declared in pyproject.toml; repeated so that running with another rootdir or -c
    # still knows the markers.
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped automatically)")
    config.addinivalue_line("markers", "slow: takes several seconds; still runs in CI")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items or _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    """True when the run was started with ``--update-golden``."""
    return bool(request.config.getoption("--update-golden"))
