"""Generated CUDA of the stepwise backend: golden files for every example, determinism, and
nvcc compiling every example's kernels for sm_90a with no register spills."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import rnncc
from rnncc.codegen.expr import cuda_float, render_body
from rnncc.codegen.source import leaf_name
from rnncc.frontend import compile_source
from rnncc.resources import templates_dir
from rnncc.runtime.build import NVCC_FLAGS, arch_flags
from rnncc.variants.stepwise import render_stepwise

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.rnn"))
GOLDEN = ROOT / "tests" / "golden"


def _generate(path: Path):
    cell = rnncc.load(path)
    return render_stepwise(cell.ir, cell.backward_ir)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_golden(path, update_golden):
    src = _generate(path)
    golden = GOLDEN / src.filename
    if update_golden:
        golden.write_text(src.text)
    assert golden.exists(), f"no golden file {golden}; run pytest --update-golden"
    assert src.text == golden.read_text(), f"{src.filename} changed; review, then --update-golden"


def test_generation_is_deterministic():
    path = next(p for p in EXAMPLES if p.stem == "slstm")
    assert _generate(path).text == _generate(path).text


def test_header_carries_version_and_source():
    text = _generate(next(p for p in EXAMPLES if p.stem == "lstm")).text
    assert f"rnncc {rnncc.__version__}" in text.splitlines()[0]
    assert "//   cell lstm(h, c) {" in text


def _body(expr: str) -> tuple[tuple[str, ...], str]:
    (cell,), _ = compile_source(f"cell t(h) {{\n  gates a, c = W x\n  h = {expr}\n}}\n")
    body = render_body([cell.update("h")], leaf_name)
    return body.lines, body.results[0]


@pytest.mark.parametrize(
    ("expr", "cuda"),
    [
        ("a - (c - h)", "g_a - (g_c - s_h)"),
        ("a - c - h", "g_a - g_c - s_h"),
        ("-a * c", "-g_a * g_c"),
        ("-(a * c)", "-(g_a * g_c)"),
        ("a / (c * h)", "g_a / (g_c * s_h)"),
        ("a ** 2 * c", "g_a * g_a * g_c"),
        ("(a + c) ** 2", "(g_a + g_c) * (g_a + g_c)"),
        ("a ** 0.5", "sqrtf(g_a)"),
        ("a ** 1.5", "powf(g_a, 1.5f)"),
        ("a ** -1", "(1.0f / g_a)"),
        ("where(a >= c, a, 0.25)", "(g_a >= g_c ? g_a : 0.25f)"),
        ("max(a, -inf) + h", "rnncc_max(g_a, (-INFINITY)) + s_h"),
        ("sigmoid(a) * 1e-6", "rnncc_sigmoid(g_a) * 1e-06f"),
        ("detach(a) + c", "g_a + g_c"),
    ],
)
def test_expression_rendering(expr, cuda):
    lines, result = _body(expr)
    assert lines == ()
    assert result == cuda


def test_shared_subexpressions_become_named_temporaries():
    lines, result = _body("tanh(a + c) * tanh(a + c) + 2")
    assert lines == ("const float v_t0 = rnncc_tanh(g_a + g_c);",)
    assert result == "v_t0 * v_t0 + 2.0f"


def test_float_literals():
    assert cuda_float(1.0) == "1.0f"
    assert cuda_float(0.1) == "0.1f"
    assert cuda_float(-2.5) == "-2.5f"
    assert cuda_float(float("inf")) == "INFINITY"


def _nvcc() -> str:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        if os.environ.get("CI"):
            pytest.fail("nvcc is not on PATH; CI must compile the generated CUDA")
        pytest.skip("nvcc is not installed here")
    return nvcc


def _compile(
    nvcc: str,
    src,
    tmp: Path,
    arch: str = "sm_90a",
    extra: tuple[str, ...] = (),
    device_only: bool = False,
) -> str:
    """nvcc's ``-Xptxas -v`` report of ``src`` built for ``arch`` (into ``tmp``), with the
    ``extra`` flags: an object file, or with ``device_only`` its device code alone (a cubin:
    the same ptxas report, without the host compiler's pass, about half the time of a small
    source)."""
    from torch.utils.cpp_extension import COMMON_NVCC_FLAGS

    tmp = tmp / arch
    tmp.mkdir(exist_ok=True)
    cu = tmp / src.filename
    cu.write_text(src.text)
    out = (
        ["-cubin", "-o", str(cu.with_suffix(".cubin"))]
        if device_only
        else ["-c", "-o", str(cu.with_suffix(".o"))]
    )
    cmd = [
        nvcc, *out, str(cu), f"-I{templates_dir()}",
        "-Xcompiler", "-fPIC", *NVCC_FLAGS, *COMMON_NVCC_FLAGS, *arch_flags(arch), "-Xptxas", "-v",
        *extra,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"nvcc failed on {src.filename}:\n{proc.stderr}"
    return proc.stderr


@pytest.mark.slow
def test_nvcc_compiles_every_example_without_spills(tmp_path):
    """The same flags as the runtime build, for sm_90a; ptxas must report no spills. The first
    example's host code is compiled too; the others' differs from it only in names."""
    nvcc = _nvcc()
    sources = [_generate(p) for p in EXAMPLES]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        reports = list(
            pool.map(
                lambda i: _compile(nvcc, sources[i], tmp_path, device_only=i > 0),
                range(len(sources)),
            )
        )
    for src, report in zip(sources, reports, strict=True):
        spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
        assert spills, f"no ptxas report for {src.filename}:\n{report}"
        assert all(s == ("0", "0") for s in spills), f"{src.filename} spills registers:\n{report}"
        assert "warning" not in report.lower(), f"{src.filename}:\n{report}"
