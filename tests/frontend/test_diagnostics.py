"""Every diagnostic of the front end: its exact line:col, its key words and its rendering.

A diagnostic renders as ``path:line:col: error: message``, then the source line indented by
four spaces, then a caret under the span's first column (DESIGN.md §1, STYLE.md "Errors").
All errors of a file come at once, in source order, and no Python traceback shows.
"""

from __future__ import annotations

import re

import pytest

from rnncc.errors import Diagnostic, DslError, DslSyntaxError
from rnncc.frontend import compile_source

PATH = "cells/t.rnn"


def diagnostics(src: str) -> tuple[Diagnostic, ...]:
    """All diagnostics of ``src``, which must not compile."""
    with pytest.raises(DslError) as info:
        compile_source(src, PATH)
    err = info.value
    text = str(err)
    assert "Traceback" not in text and 'File "' not in text
    assert text == "\n".join(d.render() for d in err.diagnostics)
    return err.diagnostics


def errors(src: str) -> list[Diagnostic]:
    return [d for d in diagnostics(src) if d.severity == "error"]


def check(diag: Diagnostic, src: str, line: int, col: int, *words: str) -> None:
    """``diag`` points at line:col, says ``words`` and draws the line with a caret."""
    assert diag.span is not None, diag.render()
    assert (diag.span.line, diag.span.col) == (line, col), diag.render()
    for word in words:
        assert word in diag.message or any(word in n for n in diag.notes), (word, diag.render())
    rendered = diag.render().splitlines()
    assert rendered[0].startswith(f"{PATH}:{line}:{col}: {diag.severity}: "), rendered[0]
    # The parser's lines: only '\n' ends one; what a terminal might take for a line break
    # shows as a space, as tabs do, and other control characters as their pictures.
    text = src.split("\n")[line - 1].removesuffix("\r")
    text = re.sub(r"[\t\v\f\r\x1c-\x1e\x85\u2028\u2029]", " ", text)
    text = re.sub(r"[\x00-\x1f]", lambda m: chr(0x2400 + ord(m[0])), text)
    text = re.sub(r"[\x80-\x9f]", "\ufffd", text.replace("\x7f", "\u2421"))
    assert rendered[1] == "    " + text
    caret = rendered[2]
    assert caret.index("^") == 4 + col - 1, diag.render()
    assert set(caret.strip()) <= {"^", "~"}


def one_error(src: str, line: int, col: int, *words: str) -> Diagnostic:
    """``src`` has exactly one error, at line:col, saying ``words``."""
    errs = errors(src)
    assert len(errs) == 1, "\n".join(d.render() for d in errs)
    check(errs[0], src, line, col, *words)
    return errs[0]


def body(*lines: str, states: str = "h") -> str:
    """A cell ``f`` whose body is ``lines`` (body line i is source line i + 1)."""
    return f"cell f({states}) {{\n" + "".join(f"    {ln}\n" for ln in lines) + "}\n"


# ---- syntax errors -----------------------------------------------------------------------
def test_unexpected_token_says_what_was_expected():
    src = body("h = h + * 2")
    errs = errors(src)
    assert len(errs) == 1
    check(errs[0], src, 2, 13, "unexpected '*'", "expected", "a name", "a number", "'('")
    with pytest.raises(DslSyntaxError):
        compile_source(src, PATH)


def test_unexpected_token_at_end_of_line():
    src = body("h = h +", "h = 1")
    err = one_error(src, 2, 12, "unexpected end of line", "expected", "a name")
    assert err.span is not None and err.span.end_col == 13


def test_unexpected_closing_paren():
    src = body("h = h )")
    one_error(src, 2, 11, "unexpected ')'", "expected")


def test_unexpected_character():
    src = body("h = h $ 1")
    one_error(src, 2, 11, "unexpected character '$'", "expected")


def test_an_unexpected_character_lists_what_the_parser_takes_there():
    """The lexer's set named ';' and a newline after '=' (where both are errors) and left
    out 'inf'; the parser's own set is the one to show."""
    err = one_error(body("h = $h"), 2, 9, "unexpected character '$'")
    assert err.message == ("unexpected character '$'; expected '(', '-', 'inf', a name or a number")
    err = one_error("cell f(\u03b1) {\n    h = h\n}\n", 1, 8, "unexpected character")
    assert err.message == "unexpected character '\u03b1'; expected ')' or a name"
    assert err.notes == ("names are ASCII letters, digits and '_'",)


@pytest.mark.parametrize("gap", ["\n", ""])
def test_a_missing_closing_brace_names_the_open_cell(gap):
    src = "cell e(h) {\n    h = tanh(h)\n" + gap + "cell f(h) {\n    h = h\n}\n"
    err = one_error(src, 3 + len(gap), 1, "unexpected 'cell'; expected '}'")
    assert err.notes == ("cell 'e' opened at line 1 is not closed",)


@pytest.mark.parametrize(
    "line, col, word, note",
    [
        ("gate a = W x + R h + b", 5, "gate", "did you mean 'gates'?"),
        ("Gates a = W x + R h + b", 5, "Gates", "did you mean 'gates'?"),
        ("inputs a, c = W x", 5, "inputs", "did you mean 'input'?"),
        ("h = h; outputs h", 12, "outputs", "did you mean 'output'?"),
        ("let a = h", 5, "let", "a statement is 'name = expression' or starts with gates,"),
    ],
)
def test_a_misspelt_statement_keyword_is_named(line, col, word, note):
    """A first word that is no keyword, followed by a name: the error is that word, not the
    '=' the parser wanted after it."""
    err = one_error(body(line, "h = tanh(h)"), 2, col, f"unknown statement '{word}'")
    assert err.span.end_col == col + len(word) and err.notes[0].startswith(note)


def test_control_characters_in_a_line_show_as_pictures():
    """A file's escape sequences, backspaces or NUL reach the terminal only as visible
    characters, one column each, so the caret stays under its column."""
    src = body("h = h + \x1b[2J\x08\x00 \x7f\x9b # \x1b]0;title\x07")
    err = one_error(src, 2, 13, "unexpected character '\\x1b'")
    shown = err.render().splitlines()[1]
    assert shown == "        h = h + \u241b[2J\u2408\u2400 \u2421\ufffd # \u241b]0;title\u2407"
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in err.render().replace("\n", ""))


def test_unexpected_end_of_file_inside_parentheses():
    src = "cell f(h) {\n    h = tanh(h"
    err = one_error(src, 2, 15, "unexpected end of file", "expected ')'")
    assert err.message.startswith("unexpected end of file; expected ')', ")  # the closer first


@pytest.mark.parametrize("end", ["", "\n", "\n\n  \n"])
def test_unexpected_end_of_file_missing_brace_points_after_last_text(end):
    src = "cell f(h) {\n    h = 1" + end
    one_error(src, 2, 10, "unexpected end of file", "'}'")  # once, not per blanked line


@pytest.mark.parametrize(
    ("src", "line", "col", "word"),
    [
        ("cell f(output) {\n    h = 1\n}\n", 1, 8, "output"),
        ("cell input(h) {\n    h = 1\n}\n", 1, 6, "input"),
        ("cell f(h, inf) {\n    h = 1\n}\n", 1, 11, "inf"),
        (body("param gates", "h = 1"), 2, 11, "gates"),
        (body("const cell = 1", "h = 1"), 2, 11, "cell"),
        (body("gates i, recurrent = W x", "h = i"), 2, 14, "recurrent"),
        (body("output = 1", "h = 1"), 2, 5, "output"),
        (body("param = 1", "h = 1"), 2, 5, "param"),
        (body("cell = 1", "h = 1"), 2, 5, "cell"),
        (body("h = const + 1"), 2, 9, "const"),
        (body("h = 1", "output input"), 3, 12, "input"),
    ],
)
def test_reserved_keyword_used_as_a_name(src, line, col, word):
    err = one_error(src, line, col, f"'{word}' is a reserved word", "cannot be used as a name")
    assert err.span is not None and err.span.end_col == col + len(word)


def test_several_syntax_errors_are_all_reported_in_order():
    src = body("t = h +", "u = * 2", "v = h )", "w = (1; 2)", "h = t $ u", "h = 1")
    errs = errors(src)
    assert [(e.span.line, e.span.col) for e in errs] == [(2, 12), (3, 9), (4, 11), (5, 11), (6, 11)]
    assert all(d.severity == "error" for d in diagnostics(src))
    assert "unexpected end of line" in errs[0].message
    assert "unexpected '*'" in errs[1].message
    assert "unexpected ')'" in errs[2].message
    assert "unexpected ';'" in errs[3].message
    assert "unexpected character '$'" in errs[4].message
    for e in errs:
        check(e, src, e.span.line, e.span.col)


def test_an_error_inside_parentheses_over_several_lines_invents_no_more():
    """The search goes on past the whole statement, not past its one line (which would leave
    its '(' open and report every later line)."""
    src = body(
        "c = (sigmoid(f) * c",
        "     + (1 - sigmoid(f)) * * tanh(z))",
        "q = 1 +",
        "h = sigmoid(o) * tanh(c)",
        states="h, c",
    )
    errs = errors(src)
    assert [(e.span.line, e.span.col) for e in errs] == [(3, 31), (4, 12)]
    assert "unexpected '*'" in errs[0].message and "unexpected end of line" in errs[1].message


@pytest.mark.parametrize(
    "src, line, col, message",
    [
        ("cell e(h, c = 1 {\n    h = h\n}\n", 1, 17, "unexpected '{'; expected ')' or ','"),
        (
            body("h = where(h < h < 1, h, h)"),
            2,
            21,
            "unexpected '<'; expected ')', '+', ',' or '-'",
        ),
    ],
)
def test_expected_lists_name_only_what_the_parser_takes(src, line, col, message):
    """LALR's lookahead sets also hold what only a reduction allows ('}' inside a header's
    parentheses); the message lists what the parser takes at that point."""
    err = one_error(src, line, col)
    assert err.message == message


def test_a_header_without_its_brace_is_one_error():
    src = "cell e(h)\n    gates a = W x + R h + b\n    h = tanh(a)\n}\n"
    one_error(src, 2, 5, "unexpected 'gates'; expected '{'")


def test_the_search_says_where_it_stopped():
    src = body(*(f"t{i} = h +" for i in range(25)), "h = 1")
    errs = errors(src)
    assert len(errs) == 20 and errs[-1].span.line == 21
    assert errs[-1].notes == ("stopped after 20 syntax errors; fix these first",)
    assert all(not e.notes for e in errs[:-1])
    assert not errors(body(*(f"t{i} = h +" for i in range(20)), "h = 1"))[-1].notes


def test_syntax_errors_in_two_cells_are_both_reported():
    src = body("h = h +") + "cell g(c) {\n    c = ) \n}\n"
    errs = errors(src)
    assert [(e.span.line, e.span.col) for e in errs] == [(2, 12), (5, 9)]


def test_semicolon_inside_parentheses_is_an_error():
    src = body("h = tanh(h;", "   + 1)")
    errs = errors(src)
    check(errs[0], src, 2, 15, "unexpected ';'", "expected")


# ---- names -------------------------------------------------------------------------------
def test_unknown_name_with_did_you_mean():
    src = body("hidden = hiden + 1", states="hidden")
    err = one_error(src, 2, 14, "unknown name 'hiden'")
    assert "did you mean 'hidden'?" in err.notes


def test_unknown_name_without_a_close_match_has_no_suggestion():
    src = body("h = zzz")
    err = one_error(src, 2, 9, "unknown name 'zzz'")
    assert not any("did you mean" in n for n in err.notes)


def test_name_bound_later_gets_a_note():
    src = body("h = a + 1", "a = 2")
    err = one_error(src, 2, 9, "unknown name 'a'")
    assert f"'a' is bound later, at {PATH}:3:5" in err.notes
    rendered = err.render().splitlines()
    assert rendered[3] == f"note: 'a' is bound later, at {PATH}:3:5"


@pytest.mark.parametrize(
    "lines, line, col",
    [(("q = q + h", "h = q"), 2, 9), (("q = (h +", "     q)", "h = q"), 3, 10)],
)
def test_a_temporary_read_in_its_own_assignment_says_so(lines, line, col):
    err = one_error(body(*lines), line, col, "unknown name 'q'")
    assert err.notes == ("'q' is bound by this assignment, which cannot read it",)


@pytest.mark.parametrize("later, col", [("param p", 11), ("const p = 2", 11), ("param q, p", 14)])
def test_a_param_or_const_declared_later_gets_the_note_and_no_warning(later, col):
    """Read before its declaration: one error with the note, not also "never used"."""
    got = [d for d in diagnostics(body("h = h * p", later)) if "'p'" in d.message]
    assert [d.severity for d in got] == ["error"], "\n".join(d.render() for d in got)
    check(got[0], body("h = h * p", later), 2, 13, "unknown name 'p'")
    assert got[0].notes == (f"'p' is bound later, at {PATH}:3:{col}",)


def test_unknown_function_did_you_mean_sigmoid():
    src = body("h = sigmod(h)")
    err = one_error(src, 2, 9, "unknown function 'sigmod'")
    assert err.span is not None and err.span.end_col == 15
    assert err.notes == ("did you mean 'sigmoid'?",)
    assert err.render().splitlines()[2] == "    " + " " * 8 + "^~~~~~"


def test_unknown_function_arguments_are_still_checked():
    src = body("h = foo(q)")
    errs = errors(src)
    assert [(e.span.line, e.span.col) for e in errs] == [(2, 9), (2, 13)]
    assert "unknown function 'foo'" in errs[0].message
    assert "unknown name 'q'" in errs[1].message


def test_calling_a_gate_as_a_function():
    src = body("gates i = W x", "h = i(h)")
    err = one_error(src, 3, 9, "'i' is a gate, not a function")
    assert err.span is not None and err.span.end_col == 10
    # the gate is referred to: no "never used" warning on top of the error
    assert not [d for d in diagnostics(src) if d.severity == "warning"]


@pytest.mark.parametrize(
    ("call", "words"),
    [
        ("max(h)", "max() takes 2 arguments, got 1"),
        ("tanh(h, h)", "tanh() takes 1 argument, got 2"),
        ("where(h > 0, h)", "where() takes 3 arguments, got 2"),
        ("sigmoid()", "sigmoid() takes 1 argument, got 0"),
    ],
)
def test_wrong_arity(call, words):
    src = body(f"h = {call}")
    err = one_error(src, 2, 9, words)
    assert err.span is not None and err.span.end_col == 9 + len(call)


@pytest.mark.parametrize(
    ("expr", "col", "op"),
    [
        ("h < 1", 9, "<"),
        ("(h == 1) + 1", 10, "=="),
        ("where(h > 0, h != 1, 2)", 22, "!="),
        ("tanh(h >= 1)", 14, ">="),
    ],
)
def test_comparison_outside_where(expr, col, op):
    src = body(f"h = {expr}")
    one_error(src, 2, col, f"comparison '{op}'", "only allowed as the first argument of where()")


def test_where_first_argument_not_a_comparison():
    src = body("h = where(h, 1, q)")
    errs = errors(src)
    check(errs[0], src, 2, 15, "first argument of where() must be a comparison")
    check(errs[1], src, 2, 21, "unknown name 'q'")  # the other arguments are still checked
    assert len(errs) == 2


def test_non_constant_exponent():
    src = body("h = h ** h")
    one_error(src, 2, 14, "exponent of '**' must be a constant")


def test_non_constant_exponent_expression():
    src = body("param p", "h = h ** (p + 1)")
    one_error(src, 3, 15, "exponent of '**' must be a constant")


# ---- states and assignments --------------------------------------------------------------
def test_state_never_assigned():
    src = body("h = 1", states="h, c = 1")
    err = one_error(src, 1, 11, "state 'c' is never assigned")
    assert err.notes == ("every state must be assigned exactly once per step",)


def test_state_assigned_twice():
    src = body("h = 1", "h = 2")
    err = one_error(src, 3, 5, "state 'h' is assigned twice")
    assert err.notes == (f"first assigned at {PATH}:2:5",)


@pytest.mark.parametrize(
    ("decl", "kind", "name"),
    [("gates i = W x", "gate", "i"), ("param p", "param", "p"), ("const k = 2", "const", "k")],
)
def test_assignment_to_gate_param_const(decl, kind, name):
    src = body(decl, f"{name} = 1", f"h = {name}")
    err = one_error(src, 3, 5, f"cannot assign to {kind} '{name}'")
    assert err.notes == (f"'{name}' is declared at {PATH}:2:{decl.index(f' {name}') + 6}",)


def test_temporary_bound_twice():
    src = body("t = 1", "t = 2", "h = t")
    err = one_error(src, 3, 5, "'t' is already bound", "bound once")
    assert err.notes == (f"first bound at {PATH}:2:5",)


# ---- projections -------------------------------------------------------------------------
@pytest.mark.parametrize("target", ["q", "i", "p"])
def test_r_applied_to_a_non_state(target):
    src = body("param p", f"gates i = W x + R {target}", "h = i + p")
    one_error(src, 3, 23, "R must multiply a state of cell 'f'", f"'{target}' is not one")


def test_r_applied_to_a_misspelt_state_suggests_it():
    src = body("gates i = R hiden", "hidden = i", states="hidden")
    err = one_error(src, 2, 17, "R must multiply a state")
    assert "did you mean 'hidden'?" in err.notes


def test_r_on_two_different_states():
    src = body("gates i = R h + W x", "recurrent j = R c", "h = i; c = j", states="h, c")
    err = one_error(src, 3, 21, "same state", "'c'", "'h'")
    assert err.notes == (f"first R term at {PATH}:2:17",)


def test_w_times_something_else_than_x():
    src = body("gates i = W y", "h = i")
    one_error(src, 2, 17, "W multiplies only the input", "'W x'")


@pytest.mark.parametrize(
    ("terms", "col", "found"),
    [("q", 15, "q"), ("W x + foo bar", 21, "foo bar"), ("b + R", 19, "R"), ("x", 15, "x")],
)
def test_bad_projection_term(terms, col, found):
    src = body(f"gates i = {terms}", "h = i")
    one_error(src, 2, col, "expected a projection term", f"found '{found}'")


@pytest.mark.parametrize(
    ("terms", "col", "term"),
    [("W x + W x", 21, "W x"), ("b + R h + b", 25, "b"), ("R h + W x + R h", 27, "R h")],
)
def test_term_repeated_in_a_projection(terms, col, term):
    src = body(f"gates i = {terms}", "h = i")
    one_error(src, 2, col, f"the term '{term}' appears twice")


def test_projection_after_an_assignment():
    src = body("t = 1", "gates i = W x", "h = t + i")
    err = one_error(src, 3, 5, "projection statements must come before any assignment")
    assert err.notes == (f"first assignment at {PATH}:2:5",)


# ---- reserved names W R x b --------------------------------------------------------------
RESERVED = ["W", "R", "x", "b"]


@pytest.mark.parametrize("name", RESERVED)
def test_reserved_letter_as_state(name):
    src = f"cell f(h, {name}) {{\n    h = 1\n}}\n"
    one_error(src, 1, 11, f"'{name}' is reserved", "cannot name a state")


@pytest.mark.parametrize("name", RESERVED)
@pytest.mark.parametrize(
    ("decl", "kind"), [("gates {} = W x", "gate"), ("param {}", "param"), ("const {} = 1", "const")]
)
def test_reserved_letter_as_gate_param_const(name, decl, kind):
    src = body(decl.format(name), "h = 1")
    one_error(src, 2, decl.index("{}") + 5, f"'{name}' is reserved", f"cannot name a {kind}")


@pytest.mark.parametrize("name", RESERVED)
def test_reserved_letter_as_temporary(name):
    src = body(f"{name} = 1", "h = 1")
    one_error(src, 2, 5, f"'{name}' is reserved", "cannot be assigned")


@pytest.mark.parametrize("name", RESERVED)
def test_reserved_letter_in_an_expression(name):
    src = body(f"h = tanh(1 + {name})")
    one_error(src, 2, 18, f"'{name}' is reserved", "cannot appear in an expression")


def test_reserved_letters_all_reported():
    src = body("h = W + R * x - b")
    errs = errors(src)
    assert [(e.span.line, e.span.col) for e in errs] == [(2, 9), (2, 13), (2, 17), (2, 21)]


# ---- duplicates --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("src", "line", "col", "kind", "first"),
    [
        ("cell f(h, h) {\n    h = 1\n}\n", 1, 11, "state", "1:8"),
        (body("gates h = W x", "h = 1"), 2, 11, "state", "1:8"),
        (body("gates i, i = W x", "h = i"), 2, 14, "gate", "2:11"),
        (body("gates i = W x", "param i", "h = i"), 3, 11, "gate", "2:11"),
        (body("param p", "const p = 1", "h = p"), 3, 11, "param", "2:11"),
        (body("param p, p", "h = p"), 2, 14, "param", "2:11"),
        (body("const k = 1", "gates k = W x", "h = k"), 3, 11, "const", "2:11"),
        (body("const h = 1", "h = 1"), 2, 11, "state", "1:8"),
        (body("param h", "h = 1"), 2, 11, "state", "1:8"),
        (body("t = 1", "param t", "h = t"), 3, 11, "temporary", "2:5"),
    ],
)
def test_duplicate_names_across_kinds(src, line, col, kind, first):
    name = src.splitlines()[line - 1][col - 1]
    err = one_error(src, line, col, f"duplicate name '{name}'", f"already declared as a {kind}")
    assert err.notes == (f"first declared at {PATH}:{first}",)


def test_duplicate_cell_names():
    src = "cell f(h) {\n    h = 1\n}\ncell g(h) {\n    h = 1\n}\ncell f(c) {\n    c = 1\n}\n"
    err = one_error(src, 7, 6, "cell 'f' is defined twice")
    assert err.notes == (f"first defined at {PATH}:1:6",)


# ---- output, const, cells, files ---------------------------------------------------------
def test_output_not_a_state():
    src = body("gates i = W x", "h = i", "output i")
    err = one_error(src, 4, 12, "output 'i' is not a state of cell 'f'")
    assert err.span is not None and err.span.end_col == 13


def test_output_misspelt_suggests_the_state():
    src = body("hidden = 1", "output hiden", states="hidden")
    err = one_error(src, 3, 12, "output 'hiden' is not a state")
    assert "did you mean 'hidden'?" in err.notes


def test_output_listed_twice():
    src = body("h = 1; c = 1", "output h, c, h", states="h, c")
    one_error(src, 3, 18, "output 'h' is listed twice")


def test_two_output_statements():
    src = body("h = 1; c = 1", "output h", "output c", states="h, c")
    err = one_error(src, 4, 5, "at most one output statement")
    assert err.span is not None and err.span.end_col == 13


def test_const_without_a_value():
    src = body("const k", "h = h * k")  # one error: the use of k is not "unknown name" too
    err = one_error(src, 2, 11, "const 'k' needs a value")
    assert err.notes == ("write: const k = 1.0",)


def test_cell_without_states():
    src = "cell f() {\n}\n"
    err = one_error(src, 1, 6, "cell 'f' has no states")
    assert err.notes


@pytest.mark.parametrize("src", ["", "\n\n", "# nothing here\n", "  ; \n"])
def test_empty_file(src):
    one_error(src, 1, 1, "no cell in this file")


# ---- warnings ----------------------------------------------------------------------------
def test_unused_gate_param_temporary_are_warnings_that_do_not_raise():
    src = body("gates i, j = W x", "param p, q", "t = i", "u = q", "h = t")
    cells, warnings = compile_source(src, PATH)
    assert [c.name for c in cells] == ["f"]
    got = [(w.severity, w.span.line, w.span.col, w.message) for w in warnings]
    assert got == [
        ("warning", 2, 14, "gate 'j' is never used"),
        ("warning", 3, 11, "param 'p' is never used"),
        ("warning", 5, 5, "temporary 'u' is never used"),
    ]
    for w in warnings:
        check(w, src, w.span.line, w.span.col)
        assert w.render().startswith(f"{PATH}:{w.span.line}:{w.span.col}: warning: ")


def test_no_warnings_for_a_clean_cell():
    assert compile_source(body("gates i = W x + R h + b", "h = tanh(i)"), PATH)[1] == []


def test_warnings_ride_along_with_errors():
    src = body("param p", "h = q")
    diags = diagnostics(src)
    assert [(d.severity, d.span.line) for d in diags] == [("warning", 2), ("error", 3)]


# ---- all errors at once ------------------------------------------------------------------
MULTI = """\
cell f(h, c, W) {
    gates i, f = W x + R h + b
    recurrent j = R c
    param i
    t = sigmod(h) + zz
    h = max(h) + where(h, 1, 2)
    h = t ** c
    i = 2
    gates g = W x
    output q
}
cell f(h) {
    h = 1
}
cell g() {
}
"""


def test_all_errors_of_a_file_at_once_in_source_order():
    errs = errors(MULTI)
    expected = [
        ((1, 11), "state 'c' is never assigned"),
        ((1, 14), "'W' is reserved"),
        ((3, 21), "same state"),
        ((4, 11), "duplicate name 'i'"),
        ((5, 9), "unknown function 'sigmod'"),
        ((5, 21), "unknown name 'zz'"),
        ((6, 9), "max() takes 2 arguments"),
        ((6, 24), "first argument of where()"),
        ((7, 5), "state 'h' is assigned twice"),
        ((7, 14), "exponent of '**'"),
        ((8, 5), "cannot assign to gate 'i'"),
        ((9, 5), "projection statements must come before"),
        ((10, 12), "output 'q' is not a state"),
        ((12, 6), "cell 'f' is defined twice"),
        ((15, 6), "cell 'g' has no states"),
    ]
    assert len(errs) == len(expected), "\n".join(e.render() for e in errs)
    for err, ((line, col), words) in zip(errs, expected, strict=True):
        check(err, MULTI, line, col, words)
    where = [(e.span.line, e.span.col) for e in diagnostics(MULTI)]
    assert where == sorted(where)  # warnings interleaved in source order too


def test_rendered_text_of_a_multi_error_file():
    with pytest.raises(DslError) as info:
        compile_source(MULTI, PATH)
    text = str(info.value)
    assert "Traceback" not in text and 'File "' not in text and "lark" not in text.lower()
    headers = [ln for ln in text.splitlines() if ln.startswith(PATH)]
    assert len(headers) == len(info.value.diagnostics)
    for line in headers:
        assert line.split(": ")[1] in ("error", "warning")
        _, ln, col = line.split(": ")[0].rsplit(":", 2)
        assert ln.isdigit() and col.isdigit()
    assert text.splitlines()[0].startswith(f"{PATH}:1:11: error: ")


def test_a_long_sum_is_no_error():
    """Expressions are checked without recursion: 3000 terms nest deeper than Python's stack."""
    (cell,), warnings = compile_source(body("h = " + " + ".join(["h"] * 3000)), PATH)
    assert cell.name == "f" and not warnings


# ---- numbers -----------------------------------------------------------------------------
TOO_LARGE = "note: the kernels compute in float32 (largest finite value about 3.4e38); write inf for infinity"
TOO_SMALL = (
    "note: the kernels compute in float32 (smallest positive value about 1.4e-45); write 0 for zero"
)


@pytest.mark.parametrize("literal", ["1e400", "1e39", "3.4028236e38", "1" + "0" * 400])
def test_a_number_too_large_for_float32(literal):
    err = one_error(body(f"h = h * {literal}"), 2, 13, "too large")
    assert err.render() == (
        f"{PATH}:2:13: error: number '{literal}' is too large for float32: it would be inf\n"
        f"        h = h * {literal}\n"
        f"                ^{'~' * (len(literal) - 1)}\n"
        f"{TOO_LARGE}"
    )


@pytest.mark.parametrize("literal", ["1e-400", "1e-50", "7e-46", "0." + "0" * 60 + "1"])
def test_a_number_too_close_to_zero_for_float32(literal):
    err = one_error(body(f"h = h + {literal}"), 2, 13, "too close to zero")
    assert err.render() == (
        f"{PATH}:2:13: error: number '{literal}' is too close to zero for float32: it would be 0\n"
        f"        h = h + {literal}\n"
        f"                ^{'~' * (len(literal) - 1)}\n"
        f"{TOO_SMALL}"
    )


def test_numbers_are_checked_wherever_they_appear():
    src = (
        "cell f(h = 1e39, c = -1e-60) {\n"
        "    param p = -2e39, q = 1e-99\n"
        "    const k = +5e38\n"
        "    h = h ** 1e40 + p + q + k - 1e39\n"
        "    c = c\n"
        "}\n"
    )
    where = [(d.span.line, d.span.col, d.message.split(" is ")[0]) for d in errors(src)]
    assert where == [
        (1, 12, "number '1e39'"),
        (1, 22, "number '-1e-60'"),
        (2, 15, "number '-2e39'"),
        (2, 26, "number '1e-99'"),
        (3, 15, "number '+5e38'"),
        (4, 14, "number '1e40'"),
        (4, 33, "number '1e39'"),  # the literal, not the minus before it
    ]


@pytest.mark.parametrize("exponent", ["(1e30 * 1e30)", "(1e-30 * 1e-30)", "(0 * inf)"])
def test_an_exponent_that_does_not_fold_to_a_number(exponent):
    err = one_error(body(f"h = h ** {exponent}"), 2, 15, "exponent")
    assert err.message == (
        "the exponent of '**' must fold to a number; this one is NaN, or float32 would make "
        "it inf or 0"
    )


@pytest.mark.parametrize(
    "literal", ["inf", "-inf", "0", "0.0", "0e999", "1e-45", "7.1e-46", "3.4028235e38", "1e38"]
)
def test_numbers_float32_holds_are_fine(literal):
    (cell,), _ = compile_source(f"cell f(h = {literal}) {{\n    h = h * {literal}\n}}\n", PATH)
    assert cell.states[0].init == float(literal)


# ---- lines as the parser counts them -----------------------------------------------------
@pytest.mark.parametrize("sep", ["\u2028", "\u2029", "\x85", "\v", "\f", "\r", "\x1c"])
def test_a_line_separator_in_a_comment_does_not_shift_the_shown_line(sep):
    """Only '\n' ends a line for the parser; the line shown under the message is that one."""
    src = f"cell f(h) {{\n    # one{sep}two\n    h = q\n}}\n"
    assert one_error(src, 3, 9, "unknown name 'q'").render() == (
        f"{PATH}:3:9: error: unknown name 'q'\n        h = q\n            ^"
    )


def test_a_form_feed_in_a_line_shows_as_a_space_over_its_column():
    src = "cell f(h) {\n\f   h = q\n}\n"
    assert one_error(src, 2, 9, "unknown name 'q'").render() == (
        f"{PATH}:2:9: error: unknown name 'q'\n        h = q\n            ^"
    )


def test_a_byte_order_mark_is_dropped_as_from_a_file():
    """``rnncc.loads`` of a file's bytes decoded as UTF-8 (the mark kept) compiles as
    ``rnncc.load`` does."""
    (err,) = errors("\ufeffcell f(h) {\n    h = q\n}\n")
    assert err.render() == f"{PATH}:2:9: error: unknown name 'q'\n        h = q\n            ^"


def test_crlf_line_ends():
    src = "cell f(h) {\r\n    h = q\r\n}\r\n"
    assert one_error(src, 2, 9, "unknown name 'q'").render() == (
        f"{PATH}:2:9: error: unknown name 'q'\n        h = q\n            ^"
    )


def test_unexpected_end_of_file_after_a_line_separator():
    src = "cell f(h) {\n    h = h # a\u2028b\n"
    assert one_error(src, 2, 16, "unexpected end of file").render().splitlines()[:3] == [
        f"{PATH}:2:16: error: unexpected end of file; expected '}}', 'const', 'gates', "
        "'input', 'output', 'param', 'recurrent' or a name",
        "        h = h # a b",
        "                   ^",
    ]


def test_a_cell_name_too_long_for_the_files_it_names():
    """A name of 300 letters passed `rnncc check` and broke `compile` halfway (the file
    system refused kernels/{name}_stepwise.cu after the package folder existed)."""
    ok = "a" * 64
    compile_source(f"cell {ok}(h) {{\n    h = h\n}}\n", PATH)
    err = one_error(f"cell {ok}b(h) {{\n    h = h\n}}\n", 1, 6, "65 characters long")
    assert err.message == "the cell's name is 65 characters long, at most 64"
