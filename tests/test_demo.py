"""The README's main job: compile the example LSTM into a package and run examples/demo.py on
it (on the GPU when there is one), which checks the results against the float64 reference."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


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
