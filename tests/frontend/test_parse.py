"""The syntax the front end accepts, and what it means once lowered to IR.

Covers separators and comments, newlines inside parentheses, several cells per file, state
initial values, operator precedence and associativity, constant folding of ``**`` exponents
(numbers and ``const``), every function of the op table, in-order semantics of assignments,
default outputs and the gate orders ``gx_names / gr_names / gb_names`` (DESIGN.md §1).
"""

from __future__ import annotations

import math

import pytest

from rnncc.errors import DslError
from rnncc.frontend import compile_source
from rnncc.frontend.parse import KEYWORDS
from rnncc.ir.cell import Cell
from rnncc.ir.node import Node
from rnncc.ir.ops import FUNCTIONS


def S(name: str) -> Node:
    return Node("state", (), name)


def G(name: str) -> Node:
    return Node("gate", (), name)


def P(name: str) -> Node:
    return Node("param", (), name)


def C(value: float) -> Node:
    return Node("const", (), float(value))


def N(op: str, *src: Node, arg: object = None) -> Node:
    return Node(op, src, arg)


def one_cell(src: str) -> Cell:
    cells, warnings = compile_source(src, "t.rnn")
    assert len(cells) == 1
    assert warnings == [], [w.render() for w in warnings]
    return cells[0]


def update(expr: str, states: str = "a, c", extra: str = "") -> Node:
    """The update of state ``a`` in a cell that assigns ``a = expr`` and ``c = c``."""
    cell = one_cell(f"cell f({states}) {{\n{extra}\n    a = {expr}\n    c = c\n}}\n")
    return cell.update("a")


LSTM = """\
# examples/lstm.rnn
cell lstm(h, c) {
    gates i, f, z, o = W x + R h + b
    c = sigmoid(f) * c + sigmoid(i) * tanh(z)
    h = sigmoid(o) * tanh(c)
}
"""

GRU = """\
cell gru(h) {
    input xr, xz, xn = W x
    recurrent hr, hz, hn = R h + b
    r = sigmoid(xr + hr)
    z = sigmoid(xz + hz)
    n = tanh(xn + r * hn)
    h = (1 - z) * n + z * h
}
"""


# ---- layout: comments, separators, blank lines, parentheses ------------------------------
def test_lstm_parses():
    cell = one_cell(LSTM)
    assert cell.name == "lstm"
    assert cell.state_names == ("h", "c")
    assert cell.recurrent == "h"
    assert cell.outputs == ("h",)
    new_c = N(
        "add",
        N("mul", N("sigmoid", G("f")), S("c")),
        N("mul", N("sigmoid", G("i")), N("tanh", G("z"))),
    )
    assert cell.update("c") == new_c
    assert cell.update("h") == N("mul", N("sigmoid", G("o")), N("tanh", new_c))


def test_comments_everywhere_and_blank_lines():
    src = """\
# leading comment

  # indented comment
cell f(h, c) # after the header
{ # after the brace

    # own line
    gates i = W x + b   # after a projection
    param p = 0.5 # after a param


    h = tanh(i) * p # after an assignment
    c = h   # trailing
    # before the closing brace
} # after the closing brace
# trailing comment
"""
    cell = one_cell(src)
    assert cell.update("h") == N("mul", N("tanh", G("i")), P("p"))
    assert cell.update("c") == cell.update("h")


def test_semicolons_separate_statements():
    one = one_cell("cell f(h, c) { gates i = W x; c = i; h = c * 2 }")
    many = one_cell("cell f(h, c) {\n gates i = W x\n c = i\n h = c * 2\n}")
    assert one == many


def test_several_semicolons_and_trailing_semicolon():
    cell = one_cell("cell f(h) {; h = 1;; ;\n;}\n;")
    assert cell.update("h") == C(1)


def test_no_newline_at_end_of_file_and_crlf():
    assert one_cell("cell f(h) { h = 1 }") == one_cell("cell f(h) {\r\n    h = 1\r\n}\r\n")


def test_newlines_inside_parentheses_are_ignored():
    src = """\
cell f(
    h,    # one; the other
    c = 1
) {
    h = max(
        c,       # comment inside parentheses; a ';' in it is comment text
        tanh(h +
             1)
    )
    c = (c
         * 2)
}
"""
    cell = one_cell(src)
    assert cell.states[1].init == 1.0
    assert cell.update("h") == N("max", S("c"), N("tanh", N("add", S("h"), C(1))))
    assert cell.update("c") == N("mul", S("c"), C(2))


def test_newline_outside_parentheses_ends_the_statement():
    with pytest.raises(DslError) as info:
        compile_source("cell f(h) {\n    h = h +\n        1\n}\n", "t.rnn")
    err = info.value.diagnostics[0]
    assert (err.span.line, err.span.col) == (2, 12)
    assert "unexpected end of line" in err.message


def test_a_semicolon_in_a_comment_ends_nothing():
    with pytest.raises(DslError) as info:
        compile_source("cell f(h) {\n    h = h +   # eq. 3; see\n        1\n}\n", "t.rnn")
    assert "unexpected end of line" in info.value.diagnostics[0].message


def test_semicolon_inside_parentheses_is_an_error():
    with pytest.raises(DslError) as info:
        compile_source("cell f(h) {\n    h = max(h; 1)\n}\n", "t.rnn")
    assert (info.value.diagnostics[0].span.line, info.value.diagnostics[0].span.col) == (2, 14)
    assert "';'" in info.value.diagnostics[0].message


def test_several_cells_per_file():
    src = LSTM + "\n" + GRU + "cell ind(h) { param u; h = relu(u * h) }\n"
    cells, warnings = compile_source(src, "t.rnn")
    assert warnings == []
    assert [c.name for c in cells] == ["lstm", "gru", "ind"]
    assert cells[0] == one_cell(LSTM)
    assert cells[1] == one_cell(GRU)


def test_cell_header_and_brace_on_separate_lines():
    assert one_cell("cell f(h)\n{\n    h = 1\n}\n") == one_cell("cell f(h) { h = 1 }")


# ---- state initial values, params, consts ------------------------------------------------
@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("-inf", -math.inf),
        ("inf", math.inf),
        ("+inf", math.inf),
        ("1.5", 1.5),
        ("-2", -2.0),
        ("1e-3", 1e-3),
        ("+4", 4.0),
        (".5", 0.5),
        ("2.", 2.0),
        ("-1.5E+2", -150.0),
    ],
)
def test_state_initial_values(text, value):
    cell = one_cell(f"cell f(h, m = {text}) {{ h = 1; m = 2 }}")
    assert cell.states[0].init == 0.0
    assert cell.states[1].init == value


def test_param_and_const_values():
    cell = one_cell(
        "cell f(h) {\n param p, q = -0.5\n const k = 3, e = 1e-6\n h = p * q + k * e\n}"
    )
    assert [(p.name, p.init) for p in cell.params] == [("p", 0.0), ("q", -0.5)]
    assert [(c.name, c.value) for c in cell.consts] == [("k", 3.0), ("e", 1e-6)]
    assert cell.update("h") == N("add", N("mul", P("p"), P("q")), C(3e-6))


def test_inf_in_expressions():
    assert update("max(a, -inf) + inf") == N("add", N("max", S("a"), C(-math.inf)), C(math.inf))
    assert update("-inf") == C(-math.inf)


def test_keywords_are_reserved_by_the_lexer():
    design = ("cell", "gates", "input", "recurrent", "param", "const", "output", "inf")
    assert set(KEYWORDS) == set(design)


# ---- precedence, associativity, folding --------------------------------------------------
def test_unary_minus_binds_looser_than_power():
    assert update("-a**2") == N("neg", N("pow", S("a"), arg=2.0))
    assert update("(-a)**2") == N("pow", N("neg", S("a")), arg=2.0)


def test_subtraction_and_division_are_left_associative():
    a, c = S("a"), S("c")
    assert update("a - c - a") == N("sub", N("sub", a, c), a)
    assert update("a / c / a") == N("div", N("div", a, c), a)
    assert update("a - (c - a)") == N("sub", a, N("sub", c, a))


def test_power_is_right_associative_and_folds():
    assert update("2 ** 3 ** 2") == C(512)
    assert update("(2 ** 3) ** 2") == C(64)
    assert update("a ** 3 ** 2") == N("pow", S("a"), arg=9.0)


def test_multiplication_binds_tighter_than_addition():
    a, c = S("a"), S("c")
    assert update("a + c * a") == N("add", a, N("mul", c, a))
    assert update("(a + c) * a") == N("mul", N("add", a, c), a)
    assert update("a * c + a / c") == N("add", N("mul", a, c), N("div", a, c))


def test_unary_minus_as_an_operand():
    a, c = S("a"), S("c")
    assert update("a * -c") == N("mul", a, N("neg", c))
    assert update("a - -c") == N("sub", a, N("neg", c))
    assert update("-a * c") == N("mul", N("neg", a), c)
    assert update("a ** -2") == N("pow", a, arg=-2.0)


def test_constant_folding():
    assert update("1 + 2 * 3 - 4 / 2") == C(5)
    # x - 0 and x + (-0) are x for every x; x + 0 is not where x is -0 (it gives +0)
    assert update("a - 0") == S("a")
    assert update("a + -0") == S("a")
    assert update("a + 0") == N("add", S("a"), C(0))
    assert update("0 + a") == N("add", C(0), S("a"))
    assert update("1 * a") == S("a")
    assert update("a ** 1") == S("a")
    assert update("- -a") == S("a")


def test_const_as_exponent():
    extra = "    const k = 2, half = 0.5"
    assert update("a ** k", extra=extra) == N("pow", S("a"), arg=2.0)
    assert update("a ** -k", extra=extra) == N("pow", S("a"), arg=-2.0)
    assert update("a ** (k * half + 1)", extra=extra) == N("pow", S("a"), arg=2.0)
    assert update("k ** k", extra=extra) == C(4)


def test_comparisons_in_where():
    a, c = S("a"), S("c")
    for sym, op in [
        ("<", "lt"),
        ("<=", "le"),
        (">", "gt"),
        (">=", "ge"),
        ("==", "eq"),
        ("!=", "ne"),
    ]:
        assert update(f"where(a {sym} c + 1, a, c)") == N(
            "where", N(op, a, N("add", c, C(1))), a, c
        )


# ---- functions ---------------------------------------------------------------------------
@pytest.mark.parametrize("fname", sorted(FUNCTIONS))
def test_every_function_is_accepted_with_its_arity(fname):
    row = FUNCTIONS[fname]
    operands = [S("a"), S("c"), N("neg", S("a"))]
    texts = ["a", "c", "-a"]
    if fname == "where":
        args, nodes = ["a > c", "c", "-a"], [N("gt", S("a"), S("c")), S("c"), N("neg", S("a"))]
    else:
        args, nodes = texts[: row.arity], operands[: row.arity]
    assert update(f"{fname}({', '.join(args)})") == N(row.name, *nodes)


@pytest.mark.parametrize("fname", sorted(FUNCTIONS))
def test_every_function_rejects_a_wrong_arity(fname):
    row = FUNCTIONS[fname]
    args = ", ".join(["a > c"] + ["a"] * row.arity)  # one too many
    with pytest.raises(DslError) as info:
        compile_source(f"cell f(a, c) {{\n    a = {fname}({args})\n    c = c\n}}\n", "t.rnn")
    assert any(f"{fname}() takes {row.arity}" in d.message for d in info.value.diagnostics)


def test_the_functions_of_the_design():
    design = "sigmoid tanh exp log logsigmoid softplus relu abs sqrt max min where detach"
    assert set(design.split()) <= set(FUNCTIONS)


# ---- in-order semantics ------------------------------------------------------------------
def test_state_read_before_assignment_is_the_old_value():
    cell = one_cell("cell f(a, c) {\n    c = a + 1\n    a = c * 2\n}\n")
    assert cell.update("c") == N("add", S("a"), C(1))
    assert cell.update("a") == N("mul", N("add", S("a"), C(1)), C(2))


def test_state_read_after_assignment_is_the_new_value():
    cell = one_cell("cell f(a, c) {\n    a = c * 2\n    c = a + 1\n}\n")
    assert cell.update("a") == N("mul", S("c"), C(2))
    assert cell.update("c") == N("add", N("mul", S("c"), C(2)), C(1))


def test_swap_through_a_temporary():
    cell = one_cell("cell f(a, c) {\n    t = a\n    a = c\n    c = t\n}\n")
    assert cell.update("a") == S("c")
    assert cell.update("c") == S("a")


def test_self_reference_reads_the_old_value():
    cell = one_cell("cell f(a) {\n    a = a * a + 1\n}\n")
    assert cell.update("a") == N("add", N("mul", S("a"), S("a")), C(1))


def test_temporaries_are_substituted_and_shared():
    cell = one_cell("cell f(a, c) {\n    t = tanh(a)\n    a = t * t\n    c = t + a\n}\n")
    t = N("tanh", S("a"))
    assert cell.update("a") == N("mul", t, t)
    assert cell.update("c") == N("add", t, N("mul", t, t))
    # CSE: one object for the shared temporary
    new_a = cell.update("a")
    assert new_a.src[0] is new_a.src[1] is cell.update("c").src[0]


def test_slstm_in_order_semantics():
    src = """\
cell slstm(h, c, n, m) {
    gates i, f, z, o = W x + R h + b
    logf = logsigmoid(f)
    m_new = where(n == 0, i, max(logf + m, i))
    ig = exp(i - m_new)
    fg = exp(logf + m - m_new)
    c = fg * c + ig * tanh(z)
    n = fg * n + ig
    m = m_new
    h = sigmoid(o) * c / n
}
"""
    cell = one_cell(src)
    logf = N("logsigmoid", G("f"))
    m_new = N("where", N("eq", S("n"), C(0)), G("i"), N("max", N("add", logf, S("m")), G("i")))
    ig = N("exp", N("sub", G("i"), m_new))
    fg = N("exp", N("sub", N("add", logf, S("m")), m_new))
    c = N("add", N("mul", fg, S("c")), N("mul", ig, N("tanh", G("z"))))
    n = N("add", N("mul", fg, S("n")), ig)
    assert cell.update("m") == m_new
    assert cell.update("c") == c
    assert cell.update("n") == n
    assert cell.update("h") == N("div", N("mul", N("sigmoid", G("o")), c), n)
    assert cell.updates[0][0] == "h"  # updates follow the state order, not the statement order


# ---- outputs, recurrence, gate orders ----------------------------------------------------
def test_default_output_is_the_recurrent_state():
    cell = one_cell("cell f(c, h) {\n gates i = W x + R h\n c = i\n h = c\n}")
    assert cell.recurrent == "h"
    assert cell.outputs == ("h",)


def test_default_output_without_r_is_the_first_state():
    cell = one_cell("cell f(c, h) {\n gates i = W x + b\n c = i\n h = c\n}")
    assert cell.recurrent is None
    assert cell.outputs == ("c",)
    assert cell.gr_names == ()


def test_explicit_output_order():
    cell = one_cell("cell f(c, h) {\n output h, c\n c = 1\n h = c\n}")
    assert cell.outputs == ("h", "c")


def test_gru_gate_orders():
    cell = one_cell(GRU)
    assert cell.recurrent == "h"
    assert [(p.keyword, p.gates, p.terms) for p in cell.projections] == [
        ("input", ("xr", "xz", "xn"), ("x",)),
        ("recurrent", ("hr", "hz", "hn"), ("r", "b")),
    ]
    assert cell.gx_names == ("xr", "xz", "xn")
    assert cell.gr_names == ("hr", "hz", "hn")
    assert cell.gb_names == ("hr", "hz", "hn")
    assert cell.outputs == ("h",)


def test_gate_orders_follow_statements_then_names():
    src = """\
cell f(h) {
    recurrent a, b2 = b + R h
    gates c1 = W x + b
    input d = W x
    h = a + b2 + c1 + d
}
"""
    cell = one_cell(src)
    assert cell.gx_names == ("c1", "d")
    assert cell.gr_names == ("a", "b2")
    assert cell.gb_names == ("a", "b2", "c1")
    assert [g.name for g in cell.gates] == ["a", "b2", "c1", "d"]
    assert cell.projections[0].terms == ("b", "r")  # terms in source order


def test_projection_without_w_x_and_the_indrnn_shape():
    cell = one_cell("cell ind(h) {\n gates g = W x + b\n param u\n h = relu(g + u * h)\n}")
    assert cell.recurrent is None
    assert cell.gx_names == cell.gb_names == ("g",)


def test_projection_may_follow_params_and_consts():
    cell = one_cell("cell f(h) {\n param p\n const k = 1\n gates i = W x\n h = i * p + k\n}")
    assert cell.gx_names == ("i",)


def test_a_long_sum_parses_without_overflowing_the_stack():
    # 600 terms nest 600 deep (left-associative): more than a recursive tree walk allows
    cell = one_cell("cell f(h) {\n    h = " + " + ".join(["h"] * 600) + "\n}\n")
    node, depth = cell.update("h"), 0
    while node.op == "add":
        node, depth = node.src[0], depth + 1
    assert depth == 599
