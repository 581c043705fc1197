"""User text → text that generated code can carry without it being read as code.

Paths, source text and names reach generated Python, C++ and JSON only through these, one
function per target: ``python_string`` (a Python string literal), ``c_string`` (a C/C++
string literal), ``c_comment`` (the text of a ``//`` or ``/* */`` comment line) and
``json_text`` (a JSON document). Each output is one line whose meaning in its target is
exactly the given text: no quote, line break, line splice or comment end in it can end the
literal or comment. Docstrings are not a target: untrusted text goes in a literal instead.
"""

from __future__ import annotations

import json
from typing import Any

#: Characters a C string literal writes as themselves: printable ASCII but the quote, the
#: backslash and ``?`` (``??/`` is a backslash where trigraphs are on).
_C_PLAIN = frozenset(chr(c) for c in range(0x20, 0x7F)) - set('"\\?')

#: A character pair whose second character ``c_comment`` escapes.
_CLOSERS = frozenset({("*", "/"), ("?", "?")})


def python_string(text: str) -> str:
    """A Python string literal of ``text``: ``repr``, which escapes quotes, backslashes and
    every character that is not printable (line breaks, U+2028, lone surrogates), so the
    literal is one line that evaluates to ``text``."""
    return repr(text)


def c_string(text: str) -> str:
    """A C/C++ string literal holding the UTF-8 bytes of ``text``; anything but plain
    printable ASCII is an octal escape (three digits, so no following character joins it),
    which keeps the literal ASCII and one line."""
    out = ['"']
    for byte in text.encode("utf-8", "surrogatepass"):
        char = chr(byte)
        out.append(char if char in _C_PLAIN else f"\\{byte:03o}")
    out.append('"')
    return "".join(out)


def c_comment(text: str) -> str:
    """``text`` made safe as the rest of a C/C++ comment line: the backslash (a line splice
    at the end of a line), every character that is not printable but the tab (line breaks
    such as ``\\r``, U+0085, U+2028, U+2029, form feed, vertical tab, bidi controls), the
    ``/`` of ``*/`` and a ``?`` after a ``?`` (trigraphs) become escapes such as ``\\x5c``
    and ``\\u2028``, which a reader sees and the compiler ignores. Other text is unchanged."""
    out = []
    for i, char in enumerate(text):
        code = ord(char)
        # "*/" ends a block comment; "??/" is a backslash where trigraphs are on.
        pair = (text[i - 1 : i], char)
        if (char.isprintable() or char == "\t") and char != "\\" and pair not in _CLOSERS:
            out.append(char)
        elif code < 0x100:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return "".join(out)


def json_text(value: Any) -> str:
    """``value`` as a JSON document: ``json.dumps``, ASCII-only (every other character is a
    ``\\u`` escape), one item per line, ending in a newline."""
    return json.dumps(value, indent=1, ensure_ascii=True) + "\n"
