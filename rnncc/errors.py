"""The one error hierarchy of rnncc.

User errors carry positions and print like a compiler (``file:line:col: error: ...``,
the source line, a caret under the span); internal errors print the IR that broke.

    RnnccError
    ├── DslError          errors in a ``.rnn`` source (syntax and semantics), all at once
    │   ├── DslSyntaxError
    │   └── SourceReadError  the source file cannot be read (missing, not UTF-8, ...)
    ├── CellSelectionError  no (or an unknown) cell chosen from a file of several (a ValueError)
    ├── TilingError       no tiling plan fits the problem on the device
    ├── BuildError        the generated sources did not compile
    └── InternalError     a bug in rnncc: an invariant of the IR does not hold
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property


@dataclass(frozen=True)
class Span:
    """A region of a source file; lines and columns count from 1, ``end_col`` is exclusive."""

    line: int
    col: int
    end_line: int
    end_col: int

    def __repr__(self) -> str:
        return f"{self.line}:{self.col}-{self.end_line}:{self.end_col}"


@dataclass(frozen=True)
class Source:
    """A source text and the name it is reported under (a path or ``<string>``)."""

    text: str
    path: str = "<string>"

    @cached_property
    def _lines(self) -> list[str]:
        return self.text.split("\n")

    def line(self, number: int) -> str:
        """Line ``number`` (from 1) as the parser counts lines: only ``\\n`` ends one, and a
        ``\\r`` before it is not part of it; ``""`` past the end."""
        lines = self._lines
        return lines[number - 1].removesuffix("\r") if 0 < number <= len(lines) else ""


#: A diagnostic shows its source line as one line of the terminal, a column per character as
#: the parser counts them: tabs and the characters other tools take for line breaks (form
#: feed, U+2028, ...) print as a space, so that the caret stays under its column; the other
#: control characters as their pictures (ESC as U+241B), so that a file's escape sequences
#: and backspaces do not drive the user's terminal.
_ONE_COLUMN = str.maketrans(
    {c: chr(0x2400 + c) for c in range(0x20)}
    | {0x7F: "\u2421"}
    | dict.fromkeys(range(0x80, 0xA0), "\ufffd")
    | dict.fromkeys(map(ord, "\t\v\f\r\x1c\x1d\x1e\x85\u2028\u2029"), " ")
)


@dataclass(frozen=True)
class Diagnostic:
    """One message about a source: an error or a warning, with optional notes."""

    severity: str  # "error" | "warning"
    message: str
    span: Span | None
    source: Source
    notes: tuple[str, ...] = field(default=())

    def render(self) -> str:
        if self.span is None:
            out = [f"{self.source.path}: {self.severity}: {self.message}"]
        else:
            sp = self.span
            out = [f"{self.source.path}:{sp.line}:{sp.col}: {self.severity}: {self.message}"]
            text = self.source.line(sp.line).translate(_ONE_COLUMN)
            out.append(f"    {text}")
            end = sp.end_col if sp.end_line == sp.line else len(text) + 1
            width = max(1, end - sp.col)
            out.append("    " + " " * (sp.col - 1) + "^" + "~" * (width - 1))
        out.extend(f"note: {n}" for n in self.notes)
        return "\n".join(out)


class RnnccError(Exception):
    """Base of every error rnncc raises on purpose."""


class DslError(RnnccError):
    """One or more errors in a ``.rnn`` source; ``diagnostics`` holds all of them."""

    def __init__(self, diagnostics: list[Diagnostic] | tuple[Diagnostic, ...]):
        self.diagnostics = tuple(diagnostics)
        super().__init__("\n".join(d.render() for d in self.diagnostics))


class DslSyntaxError(DslError):
    """The source does not parse; every diagnostic is a syntax error."""


class SourceReadError(DslError):
    """A ``.rnn`` file could not be read: missing, a directory, unreadable, not UTF-8 text.
    The message is ``path: cannot read: reason``; its one diagnostic has no span."""

    def __init__(self, path: str, reason: str):
        self.path = path
        self.reason = reason
        self.diagnostics = (Diagnostic("error", f"cannot read: {reason}", None, Source("", path)),)
        RnnccError.__init__(self, f"{path}: cannot read: {reason}")


class CellSelectionError(RnnccError, ValueError):
    """A file holds several cells and none, or an unknown one, was chosen."""


class TilingError(RnnccError):
    """No tiling plan satisfies the constraints; the message names the binding ones."""


class BuildError(RnnccError):
    """A generated source failed to compile; the message names the file and first errors."""


class InternalError(RnnccError):
    """A bug in rnncc: an IR invariant failed. The message carries the IR involved."""


class RnnccWarning(UserWarning):
    """Warnings of rnncc: unused declarations in a cell, slow fallbacks, a damaged cache entry
    rebuilt."""
