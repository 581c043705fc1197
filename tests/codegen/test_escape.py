"""The escaping helpers (``rnncc.codegen.escape``): each output means exactly its text in the
target language, checked by the target's own reader (Python's parser, g++)."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from rnncc.codegen.escape import c_comment, c_string, json_text, python_string

HOSTILE = [
    "plain",
    'x"""; import os; os.system("touch pwned"); """#',
    "x'''; open('pwned', 'w'); '''",
    "C:\\Users\\new\\cell.rnn",
    "line\nstatic int evil = 1;",
    "line\rstatic int evil = 2;",
    "\u2028static int evil = 3;\u2029\u0085",
    "*/ static int evil = 4; /*",
    "splice \\",
    "splice \\   ",
    "trigraph ??/",
    "?? ??? ????/",
    "form\ffeed\vtab\ttab",
    "nul\0bell\a esc\x1b del\x7f",
    "bidi \u202e\u2066 bom \ufeff",
    "lone surrogate \udcff",
    "astral \U0001f600 e\u0301 模型",
    '"; static int evil = 5; "',
    "\\u0041 \\x41 \\101",
]


def _gxx() -> str:
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ is not installed here")
    return gxx


@pytest.mark.parametrize("text", HOSTILE)
def test_python_string_is_one_expression_equal_to_the_text(text: str) -> None:
    literal = python_string(text)
    assert "\n" not in literal and "\r" not in literal
    module = ast.parse(f"X = {literal}\n")
    assert len(module.body) == 1
    assert ast.literal_eval(literal) == text


@pytest.mark.parametrize("text", HOSTILE)
def test_json_text_reads_back_as_the_text(text: str) -> None:
    doc = json_text({"path": text})
    assert doc.isascii() and doc.endswith("}\n")
    assert json.loads(doc) == {"path": text}


def test_c_comment_keeps_ordinary_text_and_shows_the_rest() -> None:
    assert c_comment("cell lstm(h, c) {  # tab:\there, é 模型") == (
        "cell lstm(h, c) {  # tab:\there, é 模型"
    )
    assert c_comment("a\u2028b\rc\u0085d\fe\vf") == "a\\u2028b\\x0dc\\x85d\\x0ce\\x0bf"
    assert c_comment("C:\\Users\\new") == "C:\\x5cUsers\\x5cnew"
    assert c_comment("/* x */ ??/ ?") == "/* x *\\x2f ?\\x3f/ ?"
    assert c_comment("\U0001f600 \U000e0001 \udcff") == "\U0001f600 \\U000e0001 \\udcff"


def test_c_comments_hide_every_hostile_text(tmp_path: Path) -> None:
    """After the preprocessor (trigraphs on), only the code between the comments is left: no
    text ended a comment, and no line splice pulled the next line into one."""
    gxx = _gxx()
    code = []
    for k, text in enumerate(HOSTILE):
        code += [f"// {c_comment(text)}", f"int a{k} = {k};", f"/* {c_comment(text)} */ int b{k};"]
    cpp = tmp_path / "comments.cpp"
    cpp.write_text("\n".join(code) + "\n", encoding="utf-8")
    cmd = [gxx, "-std=c++14", "-trigraphs", "-E", "-P", str(cpp)]
    pre = subprocess.run(cmd, capture_output=True, text=True)
    assert pre.returncode == 0, pre.stderr
    want = [f"int a{k} = {k};\n int b{k};" for k in range(len(HOSTILE))]
    assert pre.stdout.split() == "\n".join(want).split()


def test_c_strings_hold_the_texts_bytes(tmp_path: Path) -> None:
    gxx = _gxx()
    code = ["#include <cstdio>", "int main() {"]
    for text in HOSTILE:
        code += [
            f"  {{ static const char s[] = {c_string(text)};",
            '    std::fwrite(s, 1, sizeof s - 1, stdout); std::puts(""); }',
        ]
    code.append("}")
    cpp = tmp_path / "strings.cpp"
    cpp.write_text("\n".join(code) + "\n", encoding="ascii")
    exe = tmp_path / "strings"
    cmd = [gxx, "-std=c++14", "-trigraphs", "-Wall", "-Werror", str(cpp), "-o", str(exe)]
    build = subprocess.run(cmd, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    out = subprocess.run([str(exe)], capture_output=True, check=True).stdout
    assert out == b"".join(t.encode("utf-8", "surrogatepass") + b"\n" for t in HOSTILE)
