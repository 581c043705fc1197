"""The README's main job: compile the example LSTM into a package and run examples/demo.py on
it (on the GPU when there is one), which checks the results against the float64 reference."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _demo():
    spec = importlib.util.spec_from_file_location("demo", REPO / "examples" / "demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_demo_runs_a_compiled_package_and_matches_the_float64_reference(tmp_path):
    package = tmp_path / "lstm_cell"
    compile_ = [sys.executable, "-m", "rnncc", "compile", str(REPO / "examples" / "lstm.rnn")]
    subprocess.run([*compile_, "-o", str(package)], check=True, capture_output=True)
    demo = subprocess.run(
        [sys.executable, str(REPO / "examples" / "demo.py"), str(package)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "relative difference to the float64 reference: outputs" in demo.stdout
    assert "float64 reference against torch.nn.LSTM (float64)" in demo.stdout
    assert demo.stdout.rstrip().endswith("ok")


def test_demo_help_prints_usage(capsys):
    with pytest.raises(SystemExit) as exit_:
        _demo().parse_args(["--help"])
    out, err = capsys.readouterr()
    assert exit_.value.code == 0 and err == ""
    assert out.startswith("usage: ") and "rnncc compile examples/lstm.rnn -o build/lstm_cell" in out


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (
            "examples/gru.rnn",
            "examples/gru.rnn is a cell's source, not a compiled package: "
            "run `rnncc compile examples/gru.rnn -o build/gru_cell` and pass build/gru_cell",
        ),
        ("examples", "examples is not a compiled cell package (a folder with __init__.py, "),
    ],
)
def test_demo_wants_a_compiled_package(capsys, given, message):
    with pytest.raises(SystemExit) as exit_:
        _demo().parse_args([given])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert ": error: " + message in err.splitlines()[-1]
