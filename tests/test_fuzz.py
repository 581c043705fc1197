"""Fuzzing the front end with mutated examples: ``check`` and everything after it agree.

500 inputs, made with a fixed seed from the examples by token-level mutations (tokens
deleted, duplicated, swapped; names, numbers, operators and functions replaced by others;
deep chains, many states, duplicated statements, odd characters and line separators
inserted). For each, ``rnncc check`` either says ok, or exits 1 printing only located
diagnostics (``file:line:col: error|warning: ...``, the source line, the caret, notes), never
a traceback; whatever it accepts compiles: the package is written and every kernel source
renders. No input takes more than 2 s.
"""

from __future__ import annotations

import random
import re
import time
from pathlib import Path

import pytest

from rnncc.autodiff import derive_backward
from rnncc.cli import main
from rnncc.frontend import compile_source, read_source
from rnncc.ir.ops import FUNCTIONS
from rnncc.runtime.package import write_package
from rnncc.tiling import Problem, caps_for_arch
from rnncc.tiling.solve import points
from rnncc.variants import VARIANTS
from rnncc.variants.stepwise import render_stepwise

H100 = caps_for_arch("h100")
FUSED = [v for v in VARIANTS if v.host == "fused"]
ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.rnn"))
INPUTS = 500
SEED = 20
#: The most one input may take: to check (the front end, where a blowup would come from),
#: and to check, package and render every kernel source of what it accepts (0.85 s for the
#: slowest on an idle CI core, which other work on the machine can make twice that).
SECONDS_TO_CHECK = 2.0
SECONDS_PER_INPUT = 6.0

TOKEN = re.compile(
    r"#[^\n]*|\n|[ \t]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[A-Za-z_]\w*|\*\*|[<>=!]=|."
)
OPERATORS = ["+", "-", "*", "/", "**", "<", "<=", ">", ">=", "==", "!=", "=", ",", ";", "(", ")"]
ODD_NUMBERS = ["1e400", "1e39", "3.5e38", "1e-50", "1e-400", "0", "-0.0", "inf", "1e38", "7e-46"]
ODD_TEXT = ["\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\r", "\r\n", "\t", "\x00", "\ufeff"]
ODD_TEXT += ["é", "$", "\\", "@", "😀", "#", "\n", ";", "{", "}", "cell", "output", "R h", "W x"]


NAME = re.compile(r"[A-Za-z_]\w*")
NUMBER = re.compile(r"[\d.][\w.+-]*")
KEYWORDS = {"cell", "gates", "input", "recurrent", "param", "const", "output", "inf"}
CALLS = KEYWORDS | set(FUNCTIONS)


def _operands(toks: list[str]) -> list[int]:
    """Indices of the names that are operands: right of '=' on an assignment line."""
    found: list[int] = []
    line: list[int] = []  # the solid tokens of the current line
    for i, t in enumerate([*toks, "\n"]):
        if t == "\n":
            words = [toks[k] for k in line]
            if words and words[0] not in KEYWORDS and "=" in words:
                rhs = line[words.index("=") + 1 :]
                found += [k for k in rhs if NAME.fullmatch(toks[k]) and toks[k] not in CALLS]
            line = []
        elif not t.isspace() and not t.startswith("#"):
            line.append(i)
    return found


def _mutate(text: str, rng: random.Random, pool: dict[str, list[str]]) -> str:
    """One random mutation of ``text``; see the module docstring."""
    toks = TOKEN.findall(text)
    solid = [i for i, t in enumerate(toks) if not t.isspace() and not t.startswith("#")]
    names = [i for i in solid if NAME.fullmatch(toks[i]) and toks[i] not in KEYWORDS]
    numbers = [i for i in solid if NUMBER.fullmatch(toks[i])]
    operators = [i for i in solid if toks[i] in OPERATORS]
    operands = _operands(toks) or names
    own_names = sorted({toks[i] for i in names})
    kind = rng.randrange(12)
    if kind == 0:
        del toks[rng.choice(solid)]
    elif kind == 1:
        i = rng.choice(solid)
        toks.insert(i, toks[i])
    elif kind == 2:
        i, j = rng.choice(solid), rng.choice(solid)
        toks[i], toks[j] = toks[j], toks[i]
    elif kind == 3:  # another name: of this cell, of the examples, or a function's
        toks[rng.choice(names)] = rng.choice([*own_names, *own_names, *pool["names"], *FUNCTIONS])
    elif kind == 4 and numbers:
        toks[rng.choice(numbers)] = rng.choice(pool["numbers"] + ODD_NUMBERS)
    elif kind == 5 and operators:
        toks[rng.choice(operators)] = rng.choice(OPERATORS)
    elif kind in (6, 7):  # a deep expression where an operand was
        i = rng.choice(operands)
        name = toks[i]
        depth = rng.choice([10, 100, 400, 1500])
        op = rng.choice([" + ", " * ", " - ", " / "])
        toks[i] = rng.choice(
            [
                "(" + op.join([name] * depth) + ")",
                "(" * depth + name + ")" * depth,
                "tanh(" * depth + name + ")" * depth,
                "-" * depth + name,
            ]
        )
    elif kind == 8:  # many states, each updated from the one before
        count = rng.choice([20, 150, 400])
        states = [f"s{k}" for k in range(count)]
        text = "".join(toks)
        header = re.search(r"^cell\s+\w+\s*\(", text, re.M)
        head = header.end() - 1 if header else text.find("(")
        close = text.rfind("}")
        updates = "".join(f"\n    {s} = {states[k - 1]} * 0.5 + {s}" for k, s in enumerate(states))
        return (
            text[: head + 1] + ", ".join(states) + ", " + text[head + 1 : close] + updates + "\n}\n"
        )
    elif kind == 9:  # a statement twice
        lines = "".join(toks).split("\n")
        k = rng.randrange(len(lines))
        lines.insert(k, lines[k])
        return "\n".join(lines)
    elif kind == 10:  # odd text anywhere, comments included
        at = rng.randrange(len(text) + 1)
        return text[:at] + rng.choice(ODD_TEXT) + text[at:]
    else:
        toks[rng.choice(solid)] = rng.choice(pool["numbers"] + pool["names"] + OPERATORS)
    return "".join(toks)


def _inputs() -> list[str]:
    texts = [p.read_text(encoding="utf-8") for p in EXAMPLES]
    words = [t for text in texts for t in TOKEN.findall(text) if not t.startswith("#")]
    pool = {
        "names": sorted({w for w in words if NAME.fullmatch(w) and w not in KEYWORDS}),
        "numbers": sorted({w for w in words if NUMBER.fullmatch(w)}),
    }
    rng = random.Random(SEED)
    out = []
    for _ in range(INPUTS):
        text = rng.choice(texts)
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            text = _mutate(text, rng, pool)
        out.append(text)
    return out


def _check_diagnostics(stderr: str, path: str) -> None:
    """Every line of ``stderr`` belongs to a located diagnostic."""
    header = re.compile(rf"{re.escape(path)}:\d+:\d+: (error|warning): ")
    for line in stderr.split("\n")[:-1]:
        if not (line.startswith(("    ", "note: ")) or header.match(line)):
            raise AssertionError(f"not a located diagnostic: {line!r}\n{stderr}")


def _compiles(path: str, out: Path) -> int:
    """Every cell of the file ``path`` packages and renders every kernel source; how many cells."""
    cells, _ = compile_source(read_source(path), path)
    for cell in cells:
        write_package(cell, out)
        bwd = derive_backward(cell)
        assert render_stepwise(cell, bwd).text
        for variant in FUSED:
            for D in (64, 768):
                problem = Problem.from_cell(
                    cell, heads=1, head_dim=D, batch=16, dtype=variant.dtypes[0]
                )
                if points(variant, problem, H100):
                    assert variant.render(cell, bwd, variant.build(problem)).text
    return len(cells)


@pytest.mark.slow
def test_mutated_examples(tmp_path, capsys):
    path = str(tmp_path / "fuzz.rnn")
    accepted = rejected = 0
    slowest = slowest_check = (0.0, "")
    for n, text in enumerate(_inputs()):
        Path(path).write_text(text, encoding="utf-8")
        start = time.perf_counter()
        rc = main(["check", path])
        slowest_check = max(slowest_check, (time.perf_counter() - start, f"input {n}"))
        out, err = capsys.readouterr()
        assert "Traceback" not in out + err, text
        if rc == 0:
            assert out.startswith(f"{path}: ok ("), out
            _check_diagnostics(err, path)  # warnings
            assert _compiles(path, tmp_path / "pkg") >= 1
            accepted += 1
        else:
            assert (rc, out) == (1, ""), text
            assert re.search(rf"^{re.escape(path)}:\d+:\d+: error: ", err, re.M), err
            _check_diagnostics(err, path)
            rejected += 1
        seconds = time.perf_counter() - start
        slowest = max(slowest, (seconds, f"input {n}:\n{text[:2000]}"))
    assert slowest_check[0] < SECONDS_TO_CHECK, slowest_check
    assert slowest[0] < SECONDS_PER_INPUT, slowest
    # Both outcomes are exercised in earnest.
    assert accepted >= INPUTS // 5 and rejected >= INPUTS // 5, (accepted, rejected)
