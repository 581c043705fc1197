"""Generated CUDA of the fused block-tier forward: golden files, the support limits, and nvcc
compiling every example's kernel at two head dims for sm_90a with no register spills."""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_stepwise_codegen import _compile, _nvcc

import rnncc
from rnncc.codegen.fused import MAX_HEAD_DIM, fused_support, generate_fused, threads_for

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.rnn"))
GOLDEN = ROOT / "tests" / "golden"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_golden(path, update_golden):
    cell = rnncc.load(path)
    src = generate_fused(cell.ir, cell.backward_ir, 64)
    golden = GOLDEN / src.filename
    if update_golden:
        golden.write_text(src.text)
    assert golden.exists(), f"no golden file {golden}; run pytest --update-golden"
    assert src.text == golden.read_text(), f"{src.filename} changed; review, then --update-golden"


def test_support_limits():
    lstm = rnncc.load(ROOT / "examples" / "lstm.rnn").ir
    assert fused_support(lstm, MAX_HEAD_DIM) is None
    assert "head dim 65 > 64" in fused_support(lstm, 65)
    assert threads_for(lstm, 64) == 256 and threads_for(lstm, 8) == 128
    (wide,), _ = rnncc.frontend.compile_source(
        "cell w(h) {\n  gates " + ", ".join(f"g{k}" for k in range(20)) + " = R h\n"
        "  h = " + " + ".join(f"g{k}" for k in range(20)) + "\n}\n"
    )
    assert "1280 rows of R exceed the 1024 threads" in fused_support(wide, 64)


def test_batch_and_sequence_are_not_compiled_in():
    gru = rnncc.load(ROOT / "examples" / "gru.rnn")
    text = generate_fused(gru.ir, gru.backward_ir, 24).text
    assert "constexpr int kD = 24;" in text
    assert not re.search(r"constexpr int k(B|T)\b", text)


@pytest.mark.slow
def test_nvcc_compiles_every_example_without_spills(tmp_path):
    nvcc = _nvcc()
    cells = [rnncc.load(p) for p in EXAMPLES]
    sources = [generate_fused(c.ir, c.backward_ir, D) for c in cells for D in (24, 64)]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        reports = list(pool.map(lambda s: _compile(nvcc, s, tmp_path), sources))
    for src, report in zip(sources, reports, strict=True):
        spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
        assert spills, f"no ptxas report for {src.filename}:\n{report}"
        assert all(s == ("0", "0") for s in spills), f"{src.filename} spills registers:\n{report}"
        assert "warning" not in report.lower(), f"{src.filename}:\n{report}"
