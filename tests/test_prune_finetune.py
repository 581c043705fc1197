"""examples/prune_finetune.py end to end on the CPU, its tiny configuration: the pruned and
fine-tuned model meets the goal (within 1 point of the dense one), its saved R is zero
wherever its mask drops, the mask keeps what was asked, and the JSON holds the results."""

from __future__ import annotations

import importlib.util
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


def _example():
    spec = importlib.util.spec_from_file_location("prune_finetune", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--density", "0"], "argument --density: must be a kept fraction in (0, 1], got '0'"),
        (["--density", "1.5"], "argument --density: must be a kept fraction in (0, 1], got '1.5'"),
        (["--seq-len", "0"], "argument --seq-len: must be a positive integer, got '0'"),
        (["--batch", "0"], "argument --batch: must be a positive integer, got '0'"),
        (["--steps", "-1"], "argument --steps: must be a positive integer, got '-1'"),
        (["--lr", "nan"], "argument --lr: must be a positive number, got 'nan'"),
        (["--device", "cuda"], "argument --device: 'cuda': CUDA is not available here"),
        (["--device", "tpu"], "argument --device: must be cpu or cuda, got 'tpu'"),
        (["--json", "{tmp}"], "argument --json: '{tmp}' is a folder, not a file to write"),
        (
            ["--json", "{tmp}/no/r.json"],
            "argument --json: '{tmp}/no/r.json': no folder '{tmp}/no' to write it in",
        ),
        (["--save", ""], "argument --save: must name a file, got ''"),
    ],
)
def test_bad_arguments_are_refused_before_training(capsys, monkeypatch, tmp_path, args, message):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = [a.format(tmp=tmp_path) for a in args]
    with pytest.raises(SystemExit) as exit_:
        _example().main(args)
    out, err = capsys.readouterr()
    assert (exit_.value.code, out) == (2, "")  # nothing trained
    assert err.splitlines()[-1].endswith(": error: " + message.format(tmp=tmp_path))


def test_strings_shorter_than_the_printed_start_train(capsys):
    """The first string's start is printed up to 12 tokens: shorter strings print all of it."""
    threads = torch.get_num_threads()  # main() takes the CPU run to one thread
    args = ["--device", "cpu", "--seq-len", "2", "--hidden", "4", "--embed", "2", "--steps", "1"]
    args += ["--finetune-steps", "1", "--time-batch", "1", "--time-seq-len", "1"]
    try:
        assert _example().main(args) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "strings of 2 tokens" in out and "the first string starts " in out
    assert "test accuracy: dense" in out
