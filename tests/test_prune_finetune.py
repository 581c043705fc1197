"""examples/prune_finetune.py end to end on the CPU, its tiny configuration: the pruned and
fine-tuned model meets the goal (within 1 point of the dense one), its saved R is zero
wherever its mask drops, the mask keeps what was asked, and the JSON holds the results."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "prune_finetune.py"


@pytest.mark.slow  # about 15 s on two cores
def test_prune_finetune_tiny_configuration(tmp_path):
    out, saved = tmp_path / "results.json", tmp_path / "pruned.pt"
    args = ["--small", "--device", "cpu", "--check", "--json", str(out), "--save", str(saved)]
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "goal (pruned within 1 point of dense): met" in proc.stdout

    results = json.loads(out.read_text(encoding="utf-8"))
    assert results["goal_met"] and results["density"] == 0.3
    for key in ("dense_accuracy", "pruned_accuracy_before_finetune", "pruned_accuracy"):
        assert 0 <= results[key] <= 100
    assert results["pruned_accuracy"] - results["dense_accuracy"] == results["gap_points"] >= -1
    assert results["dropped_entries_zero"]
    for name in ("dense", "pruned"):
        timing = results["timing"][name]
        assert timing["forward_ms"] > 0 and timing["forward_backward_ms"] > 0
        assert timing["variant"] == "reference" and timing["plan"] is None

    state = torch.load(saved)
    R, mask = state["rnn.weights.0.R"], state["rnn.weights.0.R_mask"]
    D = results["hidden"]
    assert mask.dtype == torch.bool and mask.shape == R.shape == (4, 1, D, D)
    assert (R[~mask] == 0).all()  # fine-tuning left the dropped entries exactly zero
    assert (R[mask] != 0).all()
    assert (mask.sum((2, 3)) == math.ceil(0.3 * D * D)).all()  # 30 % of each gate kept
    assert results["kept_fraction"] == pytest.approx(mask.float().mean().item())
