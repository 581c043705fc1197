"""Whatever ``check`` accepts goes through every later stage, however large.

A sum of thousands of terms, thousands of chained temporaries, a cell of hundreds of states
each reading the one before, calls, negations and parentheses nested thousands deep: each is
a syntax tree or an IR DAG deeper than Python's recursion limit (1000), and must pass check,
show (and reading the print back), backward, the package, every kernel source, load and a
reference run forward and backward.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import rnncc
from rnncc.autodiff import derive_backward
from rnncc.frontend import compile_source
from rnncc.ir.cell import Cell
from rnncc.ir.printer import print_backward, print_cell
from rnncc.ir.verify import verify_backward, verify_cell
from rnncc.runtime.package import load_package, write_package
from rnncc.testing import random_inputs
from rnncc.tiling import Problem, caps_for_arch
from rnncc.tiling.solve import points
from rnncc.variants import VARIANTS
from rnncc.variants.stepwise import render_stepwise

H100 = caps_for_arch("h100")
FUSED = [v for v in VARIANTS if v.host == "fused"]
DEEP = 3000  # well past sys.getrecursionlimit()


def cell_of(*lines: str, states: str = "h") -> str:
    return (
        f"cell f({states}) {{\n    input g = W x + b\n"
        + "".join(f"    {ln}\n" for ln in lines)
        + "}\n"
    )


def through_every_stage(src: str, tmp_path: Path) -> Cell:
    """``src`` compiles, prints, reads back, differentiates, packages, renders every kernel,
    loads and runs; returns its cell."""
    assert sys.getrecursionlimit() < DEEP
    (cell,), warnings = compile_source(src, "big.rnn")
    assert not warnings
    text = print_cell(cell)
    (again,), _ = compile_source(text, "printed.rnn")
    assert print_cell(again) == text
    verify_cell(cell)
    bwd = derive_backward(cell)
    verify_backward(bwd)
    assert print_backward(bwd).startswith("# backward of cell f")
    assert render_stepwise(cell, bwd).text
    for variant in FUSED:
        for D in (64, 768):
            problem = Problem.from_cell(
                cell, heads=1, head_dim=D, batch=16, dtype=variant.dtypes[0]
            )
            if points(variant, problem, H100):
                assert variant.render(cell, bwd, variant.build(problem)).text
    package = write_package(cell, tmp_path / "pkg")
    loaded = load_package(package / "cell.json")
    assert print_cell(loaded.ir) == text
    compiled = rnncc.loads(src)
    inputs = random_inputs(cell, 2, 3, 1, 4, seed=0)
    for name in ("Wx", "R", "b"):
        if inputs[name] is not None:
            inputs[name].requires_grad_(True)  # type: ignore[union-attr]
    y, last = compiled(inputs["Wx"], inputs["R"], inputs["b"], backend="reference")
    (y.sum() + last.sum()).backward()
    assert inputs["Wx"].grad is not None  # type: ignore[union-attr]
    return cell


def test_a_sum_of_thousands_of_terms(tmp_path):
    through_every_stage(cell_of("h = g + " + " + ".join(["h"] * DEEP) + " * 0.001"), tmp_path)


@pytest.mark.parametrize("n", [150, 2000])
def test_chained_temporaries(n, tmp_path):
    lines = ["t0 = g + h", *(f"t{i} = t{i - 1} * 0.5 + h" for i in range(1, n))]
    through_every_stage(cell_of(*lines, f"h = tanh(t{n - 1})"), tmp_path)


def test_hundreds_of_states_each_reading_the_one_before(tmp_path):
    names = [f"s{i}" for i in range(400)]
    lines = [f"{s} = tanh(g + {names[i - 1]}) * {s}" for i, s in enumerate(names)]
    cell = through_every_stage(cell_of(*lines, states=", ".join(names)), tmp_path)
    assert cell.state_names == tuple(names)


@pytest.mark.parametrize(
    "expr",
    [
        "tanh(" * 1500 + "g + h" + ")" * 1500,
        "-" * DEEP + "g + h",
        "(" * DEEP + "g + h" + ")" * DEEP,
        "g ** " + " ** ".join(["1"] * DEEP) + " + h",
        "where(g < h, " * 1500 + "g" + ", h)" * 1500,
    ],
    ids=["calls", "negations", "parentheses", "powers", "wheres"],
)
def test_deep_nesting(expr, tmp_path):
    through_every_stage(cell_of(f"h = {expr}"), tmp_path)


def test_kernel_expressions_are_split_into_temporaries():
    """nvcc parses one very deep expression slowly and with gigabytes of memory: a long sum
    renders as temporaries of at most 64 operators each."""
    (cell,), _ = compile_source(cell_of("h = g + " + " + ".join(["h"] * DEEP)), "big.rnn")
    text = render_stepwise(cell, derive_backward(cell)).text
    sums = [line for line in text.splitlines() if " + s_h" in line]
    assert len(sums) >= DEEP // 64
    assert max(line.count(" + ") for line in sums) <= 64


def test_the_reference_run_of_a_long_sum_is_right():
    """None of the terms is lost on the way: one step gives g + DEEP h."""
    compiled = rnncc.loads(cell_of("h = g + " + " + ".join(["h"] * DEEP)))
    inputs = random_inputs(compiled.ir, 2, 1, 1, 4, seed=1)
    states = inputs["states"]
    y, _ = compiled(inputs["Wx"], None, inputs["b"], states=states, backend="reference")
    expected = inputs["Wx"][:, 0, 0] + inputs["b"][0] + DEEP * states[0]  # type: ignore[index]
    torch.testing.assert_close(y[0, :, 0], expected)
