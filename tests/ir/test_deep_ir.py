"""The IR passes on DAGs deeper than Python's stack, and the float32 range of constants.

Node equality, the verifier's failure message, the schedule's depth limit and the CUDA
renderer work on chains of thousands of nodes; constants fold only into numbers float32
holds, and the renderer never writes a float literal outside float's range.
"""

from __future__ import annotations

import math
import sys

import pytest

from rnncc.codegen.expr import MAX_DEPTH, CudaRenderer, cuda_float, render_body
from rnncc.errors import InternalError
from rnncc.ir.cell import Cell, State
from rnncc.ir.node import Node
from rnncc.ir.schedule import NameAllocator, schedule
from rnncc.ir.simplify import canonicalize, float32_holds, to_float32
from rnncc.ir.verify import verify_cell

DEEP = 5000


def C(value: float) -> Node:
    return Node("const", (), value)


def chain(depth: int, leaf: Node | None = None) -> Node:
    node = leaf or Node("state", (), "h")
    for _ in range(depth):
        node = Node("add", (node, Node("state", (), "h")))
    return node


def test_equality_of_deep_chains():
    assert sys.getrecursionlimit() < DEEP
    assert chain(DEEP) == chain(DEEP)
    assert chain(DEEP) != chain(DEEP, C(1.0))
    assert len({chain(DEEP), chain(DEEP)}) == 1


def test_a_verifier_failure_lists_a_deep_cell():
    bad = chain(DEEP, Node("mystery", (), None))
    cell = Cell("f", (State("h"),), (), (), (), None, (("h", bad),), ("h",))
    with pytest.raises(InternalError) as info:
        verify_cell(cell)
    lines = str(info.value).splitlines()
    assert lines[:3] == [
        "IR verification failed: unknown op 'mystery'",
        "cell f: updates",
        "  %0 = mystery()",
    ]
    assert lines[-1] == f"  h = %{DEEP + 1}"


def test_the_cuda_renderer_splits_deep_expressions():
    body = render_body([chain(DEEP)], lambda n: f"s_{n.arg}")
    assert len(body.lines) == DEEP // MAX_DEPTH
    assert body.lines[0] == "const float v_t0 = " + " + ".join(["s_h"] * (MAX_DEPTH + 1)) + ";"
    assert body.results[0].startswith(f"v_t{len(body.lines) - 1} + s_h")
    assert all(line.count(" + ") <= MAX_DEPTH for line in [*body.lines, *body.results])


def test_the_cuda_renderer_writes_a_deep_expression_whole_when_asked():
    text = CudaRenderer(lambda n: f"s_{n.arg}", {}).expr(chain(DEEP))
    assert text == " + ".join(["s_h"] * (DEEP + 1))


def test_schedule_depth_limit_binds_nothing_in_shallow_dags():
    assert schedule([chain(MAX_DEPTH - 1)], NameAllocator(), max_depth=MAX_DEPTH).bindings == ()
    deep = schedule([chain(MAX_DEPTH)], NameAllocator(), max_depth=MAX_DEPTH)
    assert [name for name, _ in deep.bindings] == ["t0"]


@pytest.mark.parametrize(
    ("value", "literal"),
    [
        (1e60, "INFINITY"),
        (-1e60, "(-INFINITY)"),
        (3.4028235677973366e38, "INFINITY"),  # rounds up to 2**128 in float32
        (1e-60, "0.0f"),
        (-1e-60, "-0.0f"),
        (3.4028234663852886e38, "3.4028234663852886e+38f"),
        (1e-45, "1e-45f"),
        (0.5, "0.5f"),
    ],
)
def test_cuda_float_writes_what_float32_holds(value, literal):
    assert cuda_float(value) == literal


def test_float32_holds():
    assert [float32_holds(v) for v in (1e38, 1e39, 1e-45, 1e-46, 0.0, -0.0, math.inf)] == [
        True,
        False,
        True,
        False,
        True,
        True,
        True,
    ]
    assert math.isnan(to_float32(math.nan)) and to_float32(1e39) == math.inf


@pytest.mark.parametrize(
    ("op", "a", "b", "folds"),
    [
        ("mul", 1e20, 1e10, 1e30),
        ("div", 1.0, 0.0, math.inf),
        ("mul", 1e30, 1e30, None),  # 1e60: float32 would make it inf
        ("mul", 1e-30, 1e-30, None),  # 1e-60: float32 would make it 0
        ("mul", 0.0, math.inf, None),  # NaN
    ],
)
def test_constants_fold_only_into_numbers_float32_holds(op, a, b, folds):
    (node,) = canonicalize([Node(op, (C(a), C(b)))])
    if folds is None:
        assert node.op == op
    else:
        assert node == C(folds)
